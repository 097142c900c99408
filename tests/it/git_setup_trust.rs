//! Setting up the git driver, against the real `git` binary, with a temporary HOME (never the
//! user's `~/.gitconfig`): `ckpt git install` global by default (a plain clone smudges and gets
//! the pre-push hook), the pre-push hook chained with another tool's in either order (a fake
//! tool that records its stdin; real Git LFS when it is installed), pointer-shaped input
//! checked by `git add`, pointers with unknown keys, and `CKPT_LOCK_TIMEOUT` in the filter.

use crate::support::git::{model, status_is_clean, GitEnv};
use ckpt::git_filter::hook::{BEGIN, END};
use ckpt::git_filter::Pointer;
use ckpt::ObjectId;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn object_files(root: &Path) -> usize {
    let Ok(fans) = std::fs::read_dir(root.join("objects")) else { return 0 };
    fans.flatten()
        .filter(|f| f.path().is_dir())
        .map(|f| std::fs::read_dir(f.path()).map_or(0, |d| d.flatten().filter(|e| e.path().is_file()).count()))
        .sum()
}

/// The other tool's pre-push lines: record stdin to `log`, fail when `OTHER_FAIL` is set.
fn other_lines(log: &Path) -> String {
    format!("cat > '{}'\n[ -z \"$OTHER_FAIL\" ] || {{ echo >&2 other tool refuses; exit 1; }}\n", log.display())
}

/// A repository at `rel` (git init only) whose `.ckptconfig` names the ckpt remote `ckpt-remote`
/// and whose `origin` is a new bare repository `rel.git`.
fn bare_setup(env: &GitEnv, rel: &str) -> PathBuf {
    let dir = env.path(rel);
    std::fs::create_dir_all(&dir).unwrap();
    env.git(&dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join(".ckptconfig"), format!("[ckpt]\n\tremote = {}\n", env.path("ckpt-remote").display()))
        .unwrap();
    env.git(env.tmp.path(), &["init", "-q", "--bare", "-b", "main", &format!("{rel}.git")]);
    env.git(&dir, &["remote", "add", "origin", env.path(&format!("{rel}.git")).to_str().unwrap()]);
    dir
}

/// Tracks `*.safetensors` and commits `model(epoch)`.
fn commit_weights(env: &GitEnv, dir: &Path, epoch: u32) {
    env.ckpt(dir, &["git", "track", "*.safetensors"]);
    std::fs::write(dir.join("model.safetensors"), model(epoch)).unwrap();
    env.git(dir, &["add", "."]);
    env.git(dir, &["commit", "-qm", &format!("epoch {epoch}")]);
}

fn hook_text(dir: &Path) -> String {
    std::fs::read_to_string(dir.join(".git/hooks/pre-push")).unwrap_or_default()
}

/// Whether the ckpt remote has the manifest of `model.safetensors` at HEAD.
fn remote_has_head_weights(env: &GitEnv, dir: &Path) -> bool {
    let pointer = env.git(dir, &["cat-file", "blob", "HEAD:model.safetensors"]);
    let id = Pointer::parse(pointer.as_bytes()).unwrap().manifest.to_hex();
    env.path("ckpt-remote").join("objects").join(&id[..2]).join(&id[2..]).is_file()
}

/// Pushes `main`, asserting success; checks the other tool received git's refs line and the
/// ckpt remote has the pushed weights.
fn push_reaches_both(env: &GitEnv, dir: &Path, log: &Path) {
    let _ = std::fs::remove_file(log);
    let o = env.run("git", dir, &["push", "-q", "origin", "main"]);
    assert!(o.status.success(), "push: {}", stderr(&o));
    let head = env.git(dir, &["rev-parse", "HEAD"]);
    let recorded = std::fs::read_to_string(log).expect("the other tool's hook ran");
    assert!(recorded.starts_with(&format!("refs/heads/main {}", head.trim())), "other tool got {recorded:?}");
    assert!(remote_has_head_weights(env, dir), "ckpt uploaded nothing: {}", stderr(&o));
}

#[test]
fn another_tools_hook_first_then_ckpt_both_get_the_refs_and_either_failing_fails_the_push() {
    let env = GitEnv::new();
    let dir = bare_setup(&env, "r");
    let log = env.path("other.log");
    let hook = dir.join(".git/hooks/pre-push");
    std::fs::write(&hook, format!("#!/bin/sh\n{}", other_lines(&log))).unwrap();
    set_executable(&hook);
    let o = env.run(env!("CARGO_BIN_EXE_ckpt"), &dir, &["git", "install", "--local"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("chained"), "{}", stderr(&o));
    let text = hook_text(&dir);
    assert!(text.starts_with(&format!("#!/bin/sh\n{BEGIN}\n")), "{text}");
    assert!(text.ends_with(&format!("{END}\n{}", other_lines(&log))), "{text}");
    // Installing again changes nothing.
    env.ckpt(&dir, &["git", "install", "--local"]);
    assert_eq!(hook_text(&dir), text);

    commit_weights(&env, &dir, 0);
    push_reaches_both(&env, &dir, &log);

    // The other tool failing fails the push.
    std::fs::write(dir.join("model.safetensors"), model(1)).unwrap();
    env.git(&dir, &["commit", "-qam", "one"]);
    let mut c = env.command("git", &dir, &["push", "-q", "origin", "main"]);
    c.env("OTHER_FAIL", "1");
    let o = c.output().unwrap();
    assert!(!o.status.success() && stderr(&o).contains("other tool refuses"), "{}", stderr(&o));
    // ckpt failing fails the push, and the other tool is not reached.
    let _ = std::fs::remove_file(&log);
    std::fs::write(env.path("not-a-dir"), b"x").unwrap();
    env.git(&dir, &["config", "ckpt.remote", env.path("not-a-dir").to_str().unwrap()]);
    let o = env.run("git", &dir, &["push", "-q", "origin", "main"]);
    assert!(!o.status.success(), "push succeeded though ckpt failed");
    assert!(stderr(&o).contains("ckpt remote"), "{}", stderr(&o));
    assert!(!log.exists());
    env.git(&dir, &["config", "--unset", "ckpt.remote"]);
    push_reaches_both(&env, &dir, &log);

    // Uninstall takes ckpt's block out and leaves the other tool's hook as it was.
    env.ckpt(&dir, &["git", "uninstall", "--local"]);
    assert_eq!(hook_text(&dir), format!("#!/bin/sh\n{}", other_lines(&log)));
}

#[test]
fn ckpt_first_then_another_tool_appending_overwriting_or_prepending_keeps_both() {
    let env = GitEnv::new();
    let dir = bare_setup(&env, "r");
    let log = env.path("other.log");
    env.ckpt(&dir, &["git", "install", "--local"]);
    let hook = dir.join(".git/hooks/pre-push");
    let own = hook_text(&dir);
    assert!(own.starts_with(&format!("#!/bin/sh\n{BEGIN}\n")), "{own}");
    commit_weights(&env, &dir, 0);

    // The other tool's installer appends its lines (what `git lfs update --manual` advises).
    std::fs::write(&hook, format!("{own}{}", other_lines(&log))).unwrap();
    push_reaches_both(&env, &dir, &log);

    // The other tool's installer overwrites the hook (`git lfs update --force`): the next time
    // ckpt's filter runs, ckpt's block goes back in first.
    std::fs::write(&hook, format!("#!/bin/sh\n{}", other_lines(&log))).unwrap();
    std::fs::write(dir.join("model.safetensors"), model(1)).unwrap();
    env.git(&dir, &["commit", "-qam", "one"]);
    assert!(hook_text(&dir).starts_with(&format!("#!/bin/sh\n{BEGIN}\n")), "{}", hook_text(&dir));
    push_reaches_both(&env, &dir, &log);

    // The other tool puts its lines before ckpt's block (which would starve ckpt of stdin):
    // the filter moves the block back first.
    let blocked = hook_text(&dir);
    let start = blocked.find(BEGIN).unwrap();
    let end = blocked.find(END).unwrap() + END.len() + 1;
    std::fs::write(&hook, format!("#!/bin/sh\n{}{}", other_lines(&log), &blocked[start..end])).unwrap();
    std::fs::write(dir.join("model.safetensors"), model(2)).unwrap();
    env.git(&dir, &["commit", "-qam", "two"]);
    assert!(hook_text(&dir).starts_with(&format!("#!/bin/sh\n{BEGIN}\n")), "{}", hook_text(&dir));
    push_reaches_both(&env, &dir, &log);

    // A hook in another language is not touched; the filter says on stderr that pushes
    // upload no weights until it is fixed, and `ckpt git install` fails naming the file.
    std::fs::write(&hook, "#!/usr/bin/env python3\nimport sys\nsys.stdin.read()\n").unwrap();
    std::fs::write(dir.join("model.safetensors"), model(3)).unwrap();
    let o = env.run("git", &dir, &["add", "model.safetensors"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a shell script") && stderr(&o).contains("does not upload"), "{}", stderr(&o));
    let o = env.run(env!("CARGO_BIN_EXE_ckpt"), &dir, &["git", "install", "--local"]);
    assert!(!o.status.success() && stderr(&o).contains("pre-push"), "{}", stderr(&o));
    assert!(hook_text(&dir).starts_with("#!/usr/bin/env python3\n"));
}

#[test]
fn install_is_global_by_default_and_a_plain_clone_smudges_and_pushes_its_weights() {
    let env = GitEnv::new();
    // Outside any repository: the user's global config only.
    let o = env.run(env!("CARGO_BIN_EXE_ckpt"), env.tmp.path(), &["git", "install"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let global = std::fs::read_to_string(env.home().join(".gitconfig")).unwrap();
    for line in ["process = ckpt git filter-process", "required = true", "textconv = ckpt git textconv"] {
        assert!(global.contains(line), "{line} missing from {global}");
    }
    // A repository made after the install: no hook until the filter runs, then ckpt's.
    let a = bare_setup(&env, "a");
    assert!(!a.join(".git/hooks/pre-push").exists());
    commit_weights(&env, &a, 0);
    assert!(hook_text(&a).contains(BEGIN), "{}", hook_text(&a));
    env.git(&a, &["push", "-q", "origin", "main"]);
    let uploaded = object_files(&env.path("ckpt-remote"));
    assert!(uploaded > 0);

    // A plain clone of the bare origin (which has no store): real files from the ckpt remote,
    // a clean status, and the hook, so its own pushes upload.
    env.git(env.tmp.path(), &["clone", "-q", env.path("a.git").to_str().unwrap(), "b"]);
    let b = env.path("b");
    assert_eq!(std::fs::read(b.join("model.safetensors")).unwrap(), model(0));
    status_is_clean(&env, &b);
    assert!(hook_text(&b).contains(BEGIN), "the clone has no pre-push hook");
    std::fs::write(b.join("model.safetensors"), model(1)).unwrap();
    env.git(&b, &["commit", "-qam", "one"]);
    env.git(&b, &["push", "-q", "origin", "main"]);
    assert!(object_files(&env.path("ckpt-remote")) > uploaded, "the clone's push uploaded no weights");
    env.git(&a, &["pull", "-q", "origin", "main"]);
    assert_eq!(std::fs::read(a.join("model.safetensors")).unwrap(), model(1));

    // Inside a repository, the global install also sets up that repository's hook.
    let c = env.path("c");
    std::fs::create_dir(&c).unwrap();
    env.git(&c, &["init", "-q"]);
    env.ckpt(&c, &["git", "install"]);
    assert!(hook_text(&c).contains(BEGIN));
    assert!(!env.git(&c, &["config", "--local", "--list"]).contains("filter.ckpt"));

    // --local: the repository's config, not the global one.
    let d = env.path("d");
    std::fs::create_dir(&d).unwrap();
    env.git(&d, &["init", "-q"]);
    let mut alt = env.command(env!("CARGO_BIN_EXE_ckpt"), &d, &["git", "install", "--local"]);
    alt.env("GIT_CONFIG_GLOBAL", env.path("other-global"));
    assert!(alt.output().unwrap().status.success());
    assert!(env.git(&d, &["config", "--local", "filter.ckpt.process"]).contains("filter-process"));
    assert!(!env.path("other-global").exists());
    // GIT_CONFIG_GLOBAL is where git's global config is, for ckpt as for git.
    let mut alt = env.command(env!("CARGO_BIN_EXE_ckpt"), env.tmp.path(), &["git", "install"]);
    alt.env("GIT_CONFIG_GLOBAL", env.path("other-global"));
    assert!(alt.output().unwrap().status.success());
    assert!(std::fs::read_to_string(env.path("other-global")).unwrap().contains("filter-process"));

    // Uninstall (global by default) removes the entries and ckpt's hook in the current repository.
    env.ckpt(&c, &["git", "uninstall"]);
    assert!(!std::fs::read_to_string(env.home().join(".gitconfig")).unwrap().contains("filter-process"));
    assert!(!c.join(".git/hooks/pre-push").exists());
}

#[test]
fn git_add_of_a_pointer_whose_file_is_nowhere_fails_naming_the_file() {
    let env = GitEnv::new();
    env.ckpt(env.tmp.path(), &["git", "install"]);
    let a = bare_setup(&env, "a");
    commit_weights(&env, &a, 0);
    let real = env.git(&a, &["cat-file", "blob", "HEAD:model.safetensors"]);
    let real_pointer = Pointer::parse(real.as_bytes()).unwrap();

    // A made-up pointer, and a real one with a wrong size: refused, nothing staged.
    let fake = Pointer::new(ObjectId::hash(b"no such file"), ObjectId::hash(b"no such manifest"), 10);
    let wrong_size = Pointer { size: real_pointer.size + 1, ..real_pointer.clone() };
    for (name, p) in [("fake.safetensors", fake), ("wrong.safetensors", wrong_size)] {
        std::fs::write(a.join(name), p.to_bytes()).unwrap();
        let o = env.run("git", &a, &["add", name]);
        assert!(!o.status.success(), "{name} was staged");
        assert!(stderr(&o).contains(name) && stderr(&o).contains("would fail at checkout"), "{}", stderr(&o));
        assert_eq!(env.git(&a, &["ls-files", name]), "", "{name} is in the index");
        std::fs::remove_file(a.join(name)).unwrap();
    }
    // A pointer whose file the store has (a copy of a tracked one): staged as the same pointer.
    std::fs::write(a.join("copy.safetensors"), &real).unwrap();
    env.git(&a, &["add", "copy.safetensors"]);
    let staged = env.git(&a, &["rev-parse", ":copy.safetensors"]);
    assert_eq!(staged, env.git(&a, &["rev-parse", "HEAD:model.safetensors"]));
    env.git(&a, &["commit", "-qm", "copy"]);
    env.git(&a, &["push", "-q", "origin", "main"]);

    // A clone that leaves pointers (its store has nothing): a pointer is accepted because the
    // ckpt remote has its file; a made-up one is refused, naming the remote.
    let mut c = env.command("git", env.tmp.path(), &["clone", "-q", env.path("a.git").to_str().unwrap(), "b"]);
    c.env("CKPT_SKIP_SMUDGE", "1");
    assert!(c.output().unwrap().status.success());
    let b = env.path("b");
    assert_eq!(std::fs::read(b.join("model.safetensors")).unwrap(), real.as_bytes());
    std::fs::write(b.join("again.safetensors"), &real).unwrap();
    env.git(&b, &["add", "again.safetensors"]);
    let fake = Pointer::new(ObjectId::hash(b"other"), ObjectId::hash(b"other manifest"), 10);
    std::fs::write(b.join("fake.safetensors"), fake.to_bytes()).unwrap();
    let o = env.run("git", &b, &["add", "fake.safetensors"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("fake.safetensors") && stderr(&o).contains("does not have it"), "{}", stderr(&o));
}

#[test]
fn a_pointer_with_an_unknown_key_is_content_to_clean_and_an_error_to_smudge() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    std::fs::write(dir.join("model.safetensors"), model(0)).unwrap();
    env.git(&dir, &["add", "."]);
    env.git(&dir, &["commit", "-qm", "zero"]);
    let real = env.git(&dir, &["cat-file", "blob", "HEAD:model.safetensors"]);
    let extended = format!("{real}zz-extra 1\n");

    // Added as a file: stored as content, so it checks out as the same bytes and status is clean.
    std::fs::write(dir.join("odd.bin"), &extended).unwrap();
    env.git(&dir, &["add", "odd.bin"]);
    env.git(&dir, &["commit", "-qm", "odd"]);
    std::fs::remove_file(dir.join("odd.bin")).unwrap();
    env.git(&dir, &["checkout", "odd.bin"]);
    assert_eq!(std::fs::read_to_string(dir.join("odd.bin")).unwrap(), extended);
    touch(&dir.join("odd.bin"));
    status_is_clean(&env, &dir);

    // Committed as a blob past the filter (another tool, by hand): checkout refuses it naming
    // the key, rather than writing a file whose status is never clean.
    std::fs::write(env.path("blob"), &extended).unwrap();
    let oid = env.git(&dir, &["hash-object", "-w", "--no-filters", env.path("blob").to_str().unwrap()]);
    env.git(&dir, &["update-index", "--add", "--cacheinfo", &format!("100644,{},x.safetensors", oid.trim())]);
    env.git(&dir, &["commit", "-qm", "x"]);
    let o = env.run("git", &dir, &["checkout", "--", "x.safetensors"]);
    let err = stderr(&o);
    assert!(!o.status.success(), "checked out: {err}");
    assert!(err.contains("x.safetensors") && err.contains("unknown key \"zz-extra\""), "{err}");
}

#[test]
fn the_filter_honours_ckpt_lock_timeout() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    std::fs::write(dir.join("model.safetensors"), model(0)).unwrap();
    env.git(&dir, &["add", "."]);
    env.git(&dir, &["commit", "-qm", "zero"]);
    // Another writer holds the store's lock: `git add` gives up after CKPT_LOCK_TIMEOUT, not 60 s.
    let lock = std::fs::File::options().write(true).open(dir.join(".git/ckpt/.ckpt/lock")).unwrap();
    lock.lock().unwrap();
    std::fs::write(dir.join("model.safetensors"), model(1)).unwrap();
    let started = Instant::now();
    let mut c = env.command("git", &dir, &["add", "model.safetensors"]);
    c.env("CKPT_LOCK_TIMEOUT", "0.5");
    let o = c.output().unwrap();
    assert!(!o.status.success(), "staged while the lock was held");
    assert!(started.elapsed() < Duration::from_secs(20), "waited {:?}", started.elapsed());
    assert!(stderr(&o).contains("another ckpt process"), "{}", stderr(&o));
    lock.unlock().unwrap();
    // A value that is not a number of seconds is an error naming it (never a panic); one too
    // large for a `Duration` waits forever, as on the command line (the one parser:
    // `repo::parse_lock_timeout`), so `git add` succeeds with the lock free.
    for bad in ["soon", "-1", "NaN"] {
        let mut c = env.command("git", &dir, &["add", "model.safetensors"]);
        c.env("CKPT_LOCK_TIMEOUT", bad);
        let o = c.output().unwrap();
        assert!(!o.status.success(), "{bad}");
        assert!(stderr(&o).contains("CKPT_LOCK_TIMEOUT") && !stderr(&o).contains("panicked"), "{bad}: {}", stderr(&o));
    }
    let mut c = env.command("git", &dir, &["add", "model.safetensors"]);
    c.env("CKPT_LOCK_TIMEOUT", "1e20");
    let o = c.output().unwrap();
    assert!(o.status.success(), "CKPT_LOCK_TIMEOUT=1e20 with the lock free: {}", stderr(&o));
}

/// Real Git LFS, both orders, when `git-lfs` is installed (`CKPT_REQUIRE_GIT_LFS=1` makes its
/// absence a failure): each tool's objects reach its own remote.
#[test]
fn with_real_git_lfs_both_stores_get_their_uploads_in_either_order() {
    let has_lfs = std::process::Command::new("git-lfs").arg("version").output().is_ok_and(|o| o.status.success());
    if !has_lfs {
        crate::support::skip("git-lfs is not installed (apt-get install git-lfs)", "CKPT_REQUIRE_GIT_LFS");
        return;
    }
    for lfs_first in [true, false] {
        let env = GitEnv::new();
        let dir = bare_setup(&env, "r");
        let lfs_install = |env: &GitEnv| {
            // In the repository, as users run it: installs its hooks there (or says it cannot).
            let _ = env.run("git", &dir, &["lfs", "install"]);
        };
        if lfs_first {
            lfs_install(&env);
            env.ckpt(&dir, &["git", "install"]);
        } else {
            env.ckpt(&dir, &["git", "install"]);
            lfs_install(&env);
        }
        env.git(&dir, &["lfs", "track", "*.dat"]);
        std::fs::write(dir.join("data.dat"), format!("lfs data, lfs first: {lfs_first}\n")).unwrap();
        commit_weights(&env, &dir, 0);
        let o = env.run("git", &dir, &["push", "-q", "origin", "main"]);
        assert!(o.status.success(), "lfs first: {lfs_first}: {}", stderr(&o));
        assert!(object_files(&env.path("ckpt-remote")) > 0, "lfs first: {lfs_first}: ckpt uploaded nothing");
        let lfs_objects = env.path("r.git/lfs/objects");
        let n = walk_files(&lfs_objects);
        assert!(n > 0, "lfs first: {lfs_first}: LFS uploaded nothing: {}\n{}", stderr(&o), hook_text(&dir));
    }
}

fn walk_files(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries.flatten().map(|e| if e.path().is_dir() { walk_files(&e.path()) } else { 1 }).sum()
}

fn touch(path: &Path) {
    let f = std::fs::File::options().append(true).open(path).unwrap();
    f.set_modified(std::time::SystemTime::now() + Duration::from_secs(5)).unwrap();
}

fn set_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}
