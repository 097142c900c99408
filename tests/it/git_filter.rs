//! The git filter against the real `git` binary: install, track, epochs of add + commit,
//! checkouts bit-exact, status after touch, branch/switch/stash/reset, clone from a local
//! path, a merge conflict on a weight file, and faults (kill -9 of the filter, missing and
//! damaged objects, bad pointers, garbage on the protocol pipe).

use crate::support::git::{model, objects, status_is_clean, GitEnv};
use crate::support::repo_util::synthetic_checkpoint;
use ckpt::git_filter::pktline::{write_flush, write_line, write_packet};
use ckpt::Dtype;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

#[test]
fn ten_epochs_through_git_check_out_bit_exact_and_dedup_on_touch() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    let attrs = std::fs::read_to_string(dir.join(".gitattributes")).unwrap();
    assert_eq!(
        attrs,
        "*.safetensors filter=ckpt diff=ckpt merge=binary -text\n*.bin filter=ckpt diff=ckpt merge=binary -text\n"
    );
    assert_eq!(env.ckpt(&dir, &["git", "track"]), "*.safetensors\n*.bin\n");
    env.git(&dir, &["add", ".gitattributes"]);
    env.git(&dir, &["commit", "-qm", "attributes"]);
    let mut commits = Vec::new();
    for epoch in 0..10 {
        std::fs::write(dir.join("model.safetensors"), model(epoch)).unwrap();
        std::fs::write(dir.join("notes.bin"), format!("epoch {epoch}")).unwrap();
        env.git(&dir, &["add", "model.safetensors", "notes.bin"]);
        env.git(&dir, &["commit", "-qm", &format!("epoch {epoch}")]);
        commits.push(env.git(&dir, &["rev-parse", "HEAD"]).trim().to_string());
    }
    // git keeps a pointer; the weights are in the store under .git/ckpt.
    let pointer = env.git(&dir, &["show", "HEAD:model.safetensors"]);
    assert!(pointer.starts_with("version ckpt/1\nhash "), "{pointer}");
    assert!(pointer.len() < 200);
    let store = dir.join(".git/ckpt");
    env.ckpt(&store, &["verify"]);
    // Older epochs are deltas: the store holds much less than the ten raw files.
    let stored: u64 = objects(&store).iter().map(|p| p.metadata().unwrap().len()).sum();
    let raw: u64 = (0..10).map(|e| model(e).len() as u64).sum();
    assert!(stored * 2 < raw, "store {stored} bytes for {raw} raw");

    for (epoch, commit) in commits.iter().enumerate().rev() {
        env.git(&dir, &["checkout", "-q", commit]);
        assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), model(epoch as u32), "epoch {epoch}");
        assert_eq!(std::fs::read(dir.join("notes.bin")).unwrap(), format!("epoch {epoch}").as_bytes());
        status_is_clean(&env, &dir);
    }
    // A touch makes git clean the file again: a hash, no new object, no new store version.
    let before = objects(&store);
    let log_before = env.ckpt(&store, &["log", "--oneline"]);
    let later = std::time::SystemTime::now() + Duration::from_secs(5);
    std::fs::File::options().write(true).open(dir.join("model.safetensors")).unwrap().set_modified(later).unwrap();
    status_is_clean(&env, &dir);
    let after = objects(&store);
    assert!(after == before, "the re-clean wrote {} object files", after.len() as i64 - before.len() as i64);
    assert_eq!(env.ckpt(&store, &["log", "--oneline"]), log_before);
    // ls-files: the tracked files of a revision, with their sizes.
    let ls = env.ckpt(&dir, &["git", "ls-files", &commits[0]]);
    let lines: Vec<&str> = ls.lines().collect();
    assert_eq!(lines.len(), 2, "{ls}");
    assert!(lines[0].ends_with("  model.safetensors") && lines[1].ends_with("  notes.bin"), "{ls}");
    assert!(!ls.contains("missing"), "{ls}");
}

#[test]
fn branch_switch_stash_and_reset_keep_weights_exact() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    std::fs::write(dir.join("model.safetensors"), model(0)).unwrap();
    env.git(&dir, &["add", "."]);
    env.git(&dir, &["commit", "-qm", "zero"]);
    env.git(&dir, &["switch", "-q", "-c", "exp"]);
    std::fs::write(dir.join("model.safetensors"), model(1)).unwrap();
    env.git(&dir, &["commit", "-qam", "one"]);
    env.git(&dir, &["switch", "-q", "main"]);
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), model(0));
    // Stash a modified weight file and bring it back.
    std::fs::write(dir.join("model.safetensors"), model(2)).unwrap();
    env.git(&dir, &["stash", "-q"]);
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), model(0));
    // fsck reaches the stashed content too: three distinct files.
    assert!(env.ckpt(&dir, &["git", "fsck"]).contains("3 distinct files checked, 0 bad"));
    status_is_clean(&env, &dir);
    env.git(&dir, &["stash", "pop", "-q"]);
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), model(2));
    env.git(&dir, &["reset", "-q", "--hard", "exp"]);
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), model(1));
    status_is_clean(&env, &dir);
}

#[test]
fn a_clone_from_a_local_path_reads_the_origins_store() {
    let env = GitEnv::new();
    // Global install: the clone has no repository config of its own before its checkout.
    env.ckpt(env.tmp.path(), &["git", "install", "--global"]);
    let global = std::fs::read_to_string(env.home().join(".gitconfig")).unwrap();
    assert!(global.contains("process = ckpt git filter-process"), "{global}");
    let dir = env.path("origin");
    std::fs::create_dir(&dir).unwrap();
    env.git(&dir, &["init", "-q", "-b", "main"]);
    env.ckpt(&dir, &["git", "track", "*.safetensors"]);
    std::fs::write(dir.join("model.safetensors"), model(3)).unwrap();
    env.git(&dir, &["add", "."]);
    env.git(&dir, &["commit", "-qm", "three"]);
    env.git(env.tmp.path(), &["clone", "-q", dir.to_str().unwrap(), "copy"]);
    assert_eq!(std::fs::read(env.path("copy/model.safetensors")).unwrap(), model(3));
    status_is_clean(&env, &env.path("copy"));
    // The objects were copied into the clone's store as they were smudged (so git status's
    // re-clean found the content stored and coded nothing: no version in the clone's store);
    // without the origin, the clone still checks the file out.
    let log = env.run(env!("CARGO_BIN_EXE_ckpt"), &env.path("copy/.git/ckpt"), &["log", "--oneline"]);
    assert!(String::from_utf8_lossy(&log.stdout).trim().is_empty(), "{log:?}");
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_file(env.path("copy/model.safetensors")).unwrap();
    env.git(&env.path("copy"), &["checkout", "model.safetensors"]);
    assert_eq!(std::fs::read(env.path("copy/model.safetensors")).unwrap(), model(3));
    env.ckpt(&env.path("copy/.git/ckpt"), &["verify"]);
    // Uninstall removes the entries again.
    env.ckpt(env.tmp.path(), &["git", "uninstall", "--global"]);
    let global = std::fs::read_to_string(env.home().join(".gitconfig")).unwrap();
    assert!(!global.contains("filter-process"), "{global}");
}

#[test]
fn a_merge_conflict_on_a_weight_file_keeps_either_side_exact() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    std::fs::write(dir.join("model.safetensors"), model(0)).unwrap();
    env.git(&dir, &["add", "."]);
    env.git(&dir, &["commit", "-qm", "zero"]);
    env.git(&dir, &["switch", "-q", "-c", "other"]);
    std::fs::write(dir.join("model.safetensors"), model(1)).unwrap();
    env.git(&dir, &["commit", "-qam", "one"]);
    env.git(&dir, &["switch", "-q", "main"]);
    std::fs::write(dir.join("model.safetensors"), model(2)).unwrap();
    env.git(&dir, &["commit", "-qam", "two"]);
    let o = env.run("git", &dir, &["merge", "other"]);
    assert!(!o.status.success());
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(out.contains("CONFLICT") && out.contains("model.safetensors"), "{out}");
    // Ours stays in the working tree, whole: no conflict markers in a pointer.
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), model(2));
    env.git(&dir, &["checkout", "--theirs", "model.safetensors"]);
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), model(1));
    env.git(&dir, &["checkout", "--ours", "model.safetensors"]);
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), model(2));
}

/// The pid of a process whose parent is `parent` and whose command line contains `needle`.
fn child_with(parent: u32, needle: &str) -> Option<u32> {
    for e in std::fs::read_dir("/proc").ok()? {
        let Ok(e) = e else { continue };
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // Fields after the command name in parentheses: state, ppid, ...
        let ppid = stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(1)).and_then(|p| p.parse().ok());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid == Some(parent) && String::from_utf8_lossy(&cmdline).contains(needle) {
            return Some(pid);
        }
    }
    None
}

#[test]
fn kill_9_of_the_filter_during_git_add_loses_nothing() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    std::fs::write(dir.join("small.safetensors"), model(0)).unwrap();
    env.git(&dir, &["add", "."]);
    env.git(&dir, &["commit", "-qm", "zero"]);
    let big = synthetic_checkpoint(3, Dtype::Bf16, &[("w", &[2048, 4096])], 1);
    std::fs::write(dir.join("big.safetensors"), &big).unwrap();
    let mut killed = false;
    for attempt in 0..3 {
        let mut git = env.command("git", &dir, &["add", "big.safetensors"]).stderr(Stdio::piped()).spawn().unwrap();
        let start = Instant::now();
        // Somewhere in the middle of the clean, at a different point each attempt.
        std::thread::sleep(Duration::from_millis(30 * attempt));
        while start.elapsed() < Duration::from_secs(20) {
            // git starts the filter through `sh -c`, which may or may not exec it: the target
            // is the process running ckpt itself.
            let child = child_with(git.id(), "filter-process");
            let is_ckpt =
                |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "ckpt");
            let target = child.and_then(|c| if is_ckpt(c) { Some(c) } else { child_with(c, "filter-process") });
            if let Some(pid) = target.filter(|&p| is_ckpt(p)) {
                killed = kill_9(pid);
                break;
            }
            if git.try_wait().unwrap().is_some() {
                break;
            }
        }
        let o = git.wait_with_output().unwrap();
        if killed {
            assert!(!o.status.success(), "git add succeeded though its filter was killed");
            break;
        }
        // The filter was faster than the test: undo and try again.
        env.git(&dir, &["reset", "-q"]);
    }
    assert!(killed, "never caught the filter running");
    let store = dir.join(".git/ckpt");
    env.ckpt(&store, &["verify"]);
    env.git(&dir, &["add", "big.safetensors"]);
    env.git(&dir, &["commit", "-qm", "big"]);
    std::fs::remove_file(dir.join("big.safetensors")).unwrap();
    env.git(&dir, &["checkout", "big.safetensors"]);
    assert_eq!(std::fs::read(dir.join("big.safetensors")).unwrap(), big);
}

/// SIGKILL through the `kill` command (the tests stay free of unsafe code).
fn kill_9(pid: u32) -> bool {
    Command::new("kill").args(["-9", &pid.to_string()]).status().is_ok_and(|s| s.success())
}

#[test]
fn a_missing_or_damaged_object_fails_the_checkout_without_wrong_bytes() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    std::fs::write(dir.join("model.safetensors"), model(0)).unwrap();
    env.git(&dir, &["add", "."]);
    env.git(&dir, &["commit", "-qm", "zero"]);
    std::fs::write(dir.join("model.safetensors"), model(5)).unwrap();
    env.git(&dir, &["commit", "-qam", "five"]);
    let store = dir.join(".git/ckpt");
    let pointer = env.git(&dir, &["show", "HEAD~1:model.safetensors"]);
    let manifest = pointer.lines().find_map(|l| l.strip_prefix("manifest ")).unwrap().to_string();
    let object = store.join(".ckpt/objects").join(&manifest[..2]).join(&manifest[2..]);
    let saved = std::fs::read(&object).unwrap();

    // Missing: git stops (the filter is required) and names the file; the working file is
    // still the one from before, never partial or wrong.
    assert!(env.ckpt(&dir, &["git", "fsck"]).contains("2 distinct files checked, 0 bad"));
    std::fs::remove_file(&object).unwrap();
    // fsck names the file whose object is gone.
    let o = env.run(env!("CARGO_BIN_EXE_ckpt"), &dir, &["git", "fsck"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("model.safetensors") && err.contains(&manifest), "{err}");
    let o = env.run("git", &dir, &["checkout", "-q", "HEAD~1"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("model.safetensors") && err.contains(&manifest) && err.contains("ckpt.store"), "{err}");
    let now = std::fs::read(dir.join("model.safetensors")).unwrap_or_default();
    assert!(now == model(5) || now.is_empty(), "the working file holds wrong bytes");

    // Damaged: one flipped byte in the middle of the object.
    let mut bad = saved.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x40;
    std::fs::write(&object, &bad).unwrap();
    let o = env.run("git", &dir, &["checkout", "-q", "HEAD~1"]);
    assert!(!o.status.success());
    let now = std::fs::read(dir.join("model.safetensors")).unwrap_or_default();
    assert!(now == model(5) || now.is_empty(), "the working file holds wrong bytes");

    // Restored: the checkout works.
    std::fs::write(&object, &saved).unwrap();
    env.git(&dir, &["checkout", "-q", "-f", "HEAD~1"]);
    assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), model(0));
}

fn handshake(out: &mut Vec<u8>) {
    write_line(out, "git-filter-client").unwrap();
    write_line(out, "version=2").unwrap();
    write_flush(out).unwrap();
    write_line(out, "capability=clean").unwrap();
    write_line(out, "capability=smudge").unwrap();
    write_flush(out).unwrap();
}

fn request(out: &mut Vec<u8>, command: &str, path: &str, content: &[u8]) {
    write_line(out, &format!("command={command}")).unwrap();
    write_line(out, &format!("pathname={path}")).unwrap();
    write_flush(out).unwrap();
    for c in content.chunks(65516) {
        write_packet(out, c).unwrap();
    }
    write_flush(out).unwrap();
}

/// Runs `ckpt git filter-process` in `dir` on `input`; fails the test if it hangs.
fn filter_process(env: &GitEnv, dir: &Path, input: &[u8]) -> Output {
    let mut child = env
        .command(env!("CARGO_BIN_EXE_ckpt"), dir, &["git", "filter-process"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(start.elapsed() < Duration::from_secs(30), "filter-process hangs");
        std::thread::sleep(Duration::from_millis(10));
    }
    writer.join().unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn bad_pointers_and_garbage_on_the_pipe_are_clear_errors() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    let good_hex = "ab".repeat(32);
    let good = format!("version ckpt/1\nhash {good_hex}\nmanifest {good_hex}\nsize 10\n");
    let bad: Vec<(String, &str)> = vec![
        (good.replace("hash ab", "hash zz"), "hash: not 64 lowercase hex digits"),
        (good.replace("size 10", "size ten"), "size: not a decimal number"),
        (good.replace("ckpt/1", "ckpt/9"), "first line is not"),
        (good[..60].to_string(), "truncated"),
        (good.clone(), "cannot restore the file"),
    ];
    let mut input = Vec::new();
    handshake(&mut input);
    for (pointer, _) in &bad {
        request(&mut input, "smudge", "w.safetensors", pointer.as_bytes());
    }
    // Still serving after the errors: a clean (of a pointer whose file is nowhere: an error
    // too, as committed it could not be checked out) and a pass-through smudge.
    request(&mut input, "clean", "n.bin", good.as_bytes());
    request(&mut input, "smudge", "plain.bin", b"not a pointer");
    let o = filter_process(&env, &dir, &input);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    for (_, message) in &bad {
        assert!(err.contains(message), "stderr lacks {message:?}: {err}");
    }
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.matches("status=error").count(), bad.len() + 1);
    assert!(err.contains("n.bin: this is a ckpt pointer, but the file it names"), "{err}");
    assert!(!out.contains(&good), "{out}");
    assert!(out.contains("not a pointer"));

    // Garbage instead of the protocol: exit 1 with a message, no hang, nothing on stdout
    // beyond protocol.
    for garbage in [&b"hello world\n"[..], b"0000", b"ffffxxxx", b"0003"] {
        let o = filter_process(&env, &dir, garbage);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("ckpt git filter-process") && !err.contains("panicked"), "{err}");
        assert!(o.stdout.is_empty());
    }

    // The one-shot smudge fails on a bad pointer too.
    let mut c = env
        .command(env!("CARGO_BIN_EXE_ckpt"), &dir, &["git", "smudge", "w.safetensors"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(bad[0].0.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("w.safetensors: invalid ckpt pointer"));
    assert!(o.stdout.is_empty());
}

#[test]
fn skip_smudge_leaves_pointers_and_ckpt_git_checkout_fills_them() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/model.safetensors"), model(4)).unwrap();
    std::fs::write(dir.join("other.safetensors"), model(6)).unwrap();
    env.git(&dir, &["add", "."]);
    env.git(&dir, &["commit", "-qm", "four"]);
    std::fs::remove_file(dir.join("sub/model.safetensors")).unwrap();
    std::fs::remove_file(dir.join("other.safetensors")).unwrap();
    let o = env.command("git", &dir, &["checkout", "--", "."]).env("CKPT_SKIP_SMUDGE", "1").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let pointer = std::fs::read(dir.join("sub/model.safetensors")).unwrap();
    assert!(pointer.starts_with(b"version ckpt/1\n"));
    // A pointer in the working tree cleans to itself: nothing looks modified.
    status_is_clean(&env, &dir);
    env.ckpt(&dir, &["git", "checkout", "sub"]);
    assert_eq!(std::fs::read(dir.join("sub/model.safetensors")).unwrap(), model(4));
    assert!(std::fs::read(dir.join("other.safetensors")).unwrap().starts_with(b"version ckpt/1\n"));
    status_is_clean(&env, &dir);
    env.ckpt(&dir, &["git", "checkout"]);
    assert_eq!(std::fs::read(dir.join("other.safetensors")).unwrap(), model(6));
    status_is_clean(&env, &dir);
}

#[test]
fn git_diff_shows_per_tensor_statistics_and_log_shows_changed_tensors() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    let shapes: &[(&str, &[u64])] = &[("a.weight", &[64, 64]), ("b.weight", &[64, 64])];
    let v1 = synthetic_checkpoint(1, Dtype::Bf16, shapes, 0);
    std::fs::write(dir.join("model.safetensors"), &v1).unwrap();
    env.git(&dir, &["add", "."]);
    env.git(&dir, &["commit", "-qm", "one"]);
    // Change b.weight only: its last element's lowest exponent bit (the value doubles or
    // halves), keeping the header.
    let mut v2 = v1.clone();
    let n = v2.len();
    v2[n - 1] ^= 0x01;
    let bf16 = |b: &[u8]| f32::from_bits((u32::from(b[1]) << 24) | (u32::from(b[0]) << 16)) as f64;
    let delta = (bf16(&v2[n - 2..]) - bf16(&v1[n - 2..])).abs();
    std::fs::write(dir.join("model.safetensors"), &v2).unwrap();
    // `git diff` runs the external diff driver with both sides: one changed element of 4096
    // (0.02%) in b.weight, a.weight the same.
    let diff = env.git(&dir, &["diff"]);
    let line = |name: &str| {
        diff.lines().find(|l| l.get(2..).is_some_and(|r| r.starts_with(name))).unwrap_or_else(|| panic!("{diff}"))
    };
    let words = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(
        words(line("b.weight")),
        words(&format!("~ b.weight BF16 [64, 64] changed 0.02% {delta:.6e}")),
        "{diff}"
    );
    assert_eq!(words(line("a.weight")), words(&format!("  a.weight BF16 [64, 64] same 0.00% {:.6e}", 0.0)), "{diff}");
    assert!(
        diff.contains("1 tensors changed, 1 same, 0 added, 0 removed, 0 reshaped; 1 of 8192 elements changed (0.01%)"),
        "{diff}"
    );
    env.git(&dir, &["commit", "-qam", "two"]);
    // `git log -p` without --ext-diff: the textconv, one line per tensor (the changed
    // tensor's line changes with its blob id).
    let log = env.git(&dir, &["log", "-p", "-1"]);
    assert!(
        log.contains("-tensor b.weight") && log.contains("+tensor b.weight") && !log.contains("+tensor a.weight"),
        "{log}"
    );
    // With --ext-diff, both sides from git (pointers, written from the store): the statistics.
    let log = env.git(&dir, &["log", "-p", "--ext-diff", "-1"]);
    let b_line = log.lines().find(|l| l.starts_with("~ b.weight")).unwrap_or_else(|| panic!("{log}"));
    assert_eq!(words(b_line), words(&format!("~ b.weight BF16 [64, 64] changed 0.02% {delta:.6e}")), "{log}");
    // A tensor added and one reshaped.
    let v3 = synthetic_checkpoint(1, Dtype::Bf16, &[("a.weight", &[32, 64]), ("c.bias", &[64])], 0);
    std::fs::write(dir.join("model.safetensors"), &v3).unwrap();
    let diff = env.git(&dir, &["diff"]);
    assert!(diff.contains("reshaped to BF16 [32, 64]") && diff.contains("removed") && diff.contains("added"), "{diff}");
    // Objects gone: git smudges both sides before it runs the driver, so it fails as a
    // checkout would, naming the file and the object.
    std::fs::remove_dir_all(dir.join(".git/ckpt/.ckpt/objects")).unwrap();
    std::fs::create_dir(dir.join(".git/ckpt/.ckpt/objects")).unwrap();
    let o = env.run("git", &dir, &["log", "-p", "--ext-diff", "-1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("model.safetensors") && err.contains("is missing"), "{o:?}");
}

#[test]
fn two_hundred_files_in_one_git_add_start_the_filter_once() {
    let env = GitEnv::new();
    let dir = env.repo("r");
    for i in 0..200 {
        std::fs::write(dir.join(format!("f{i}.bin")), format!("file {i}")).unwrap();
    }
    let o = env.command("git", &dir, &["add", "."]).env("GIT_TRACE", "1").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let trace = String::from_utf8_lossy(&o.stderr);
    assert_eq!(trace.matches("run_command: 'ckpt git filter-process'").count(), 1, "{trace}");
    let staged = env.git(&dir, &["ls-files", "--cached", "*.bin"]);
    assert_eq!(staged.lines().count(), 200);
    assert!(env.git(&dir, &["show", ":f7.bin"]).starts_with("version ckpt/1\n"));
}
