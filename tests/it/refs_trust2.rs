//! A ref that cannot be read is never walked as "no versions" (issue 39, item 2): a directory,
//! a FIFO, a symbolic link loop or a link to nothing in place of `refs/heads/main` (or of
//! `HEAD`) makes `verify` report it and `gc` and `prune` refuse before deleting anything, and
//! nothing waits on a FIFO.

use crate::support::repo_util::{ckpt_command, output_within, stderr, TestRepo};
use crate::support::util::noise;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

/// A repository with two versions on `main` and a tag on the first, so prune has something to
/// drop.
fn repo_with_history() -> TestRepo {
    let t = TestRepo::init();
    for epoch in 0..3u64 {
        t.write("model.bin", &noise(epoch, 64 << 10));
        let o = t.ckpt(&["commit", "-m", &format!("epoch {epoch}"), "model.bin"]);
        assert!(o.status.success(), "commit: {}", stderr(&o));
    }
    t
}

/// Runs `ckpt args` in `dir`, failing the test if it has not ended within 60 s.
fn run(dir: &Path, args: &[&str]) -> Output {
    output_within(ckpt_command(dir, args), Duration::from_secs(60))
        .unwrap_or_else(|| panic!("ckpt {args:?} did not end within 60 s"))
}

fn object_files(t: &TestRepo) -> Vec<String> {
    let mut out: Vec<String> = t.object_files().iter().map(|p| p.display().to_string()).collect();
    out.sort();
    out
}

/// The kinds of damage: each replaces the file at `path` by something that is not a ref file.
fn damage(kind: &str, path: &Path) {
    std::fs::remove_file(path).unwrap();
    let status = match kind {
        "directory" => {
            std::fs::create_dir(path).unwrap();
            return;
        }
        "fifo" => std::process::Command::new("mkfifo").arg(path).status().unwrap(),
        "symlink loop" => {
            std::os::unix::fs::symlink(path.file_name().unwrap(), path).unwrap();
            return;
        }
        "link to nothing" => {
            std::os::unix::fs::symlink("no-such-ref", path).unwrap();
            return;
        }
        other => panic!("no damage {other}"),
    };
    assert!(status.success());
}

const KINDS: [&str; 4] = ["directory", "fifo", "symlink loop", "link to nothing"];

#[test]
fn an_unreadable_branch_ref_stops_gc_and_prune_and_fails_verify() {
    for kind in KINDS {
        let t = repo_with_history();
        let before = object_files(&t);
        damage(kind, &t.path(".ckpt/refs/heads/main"));

        let verify = run(t.root(), &["verify"]);
        assert!(!verify.status.success(), "{kind}: verify passed: {}", stderr(&verify));
        let said = format!("{}{}", String::from_utf8_lossy(&verify.stdout), stderr(&verify));
        assert!(said.contains("refs/heads/main"), "{kind}: verify names the ref: {said}");

        for args in [&["gc", "--prune=now"][..], &["prune", "--keep-last", "1"][..]] {
            let o = run(t.root(), args);
            assert!(!o.status.success(), "{kind}: ckpt {args:?} went ahead: {}", stderr(&o));
            assert!(stderr(&o).contains("refs/heads/main"), "{kind}: {args:?} names the ref: {}", stderr(&o));
        }
        assert_eq!(object_files(&t), before, "{kind}: nothing was deleted");
    }
}

#[test]
fn an_unreadable_tag_or_remote_tracking_ref_stops_gc() {
    for kind in KINDS {
        for name in ["refs/tags/best", "refs/remotes/origin/main"] {
            let t = repo_with_history();
            let log: serde_json::Value = serde_json::from_slice(&t.ckpt(&["log", "--json"]).stdout).unwrap();
            let first = log.as_array().unwrap().last().unwrap()["id"].as_str().unwrap().to_string();
            let path = t.path(&format!(".ckpt/{name}"));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, format!("{first}\n")).unwrap();
            let before = object_files(&t);
            damage(kind, &path);
            let o = run(t.root(), &["gc", "--prune=now"]);
            assert!(!o.status.success(), "{kind} at {name}: gc went ahead: {}", stderr(&o));
            assert!(stderr(&o).contains(name), "{kind} at {name}: gc names the ref: {}", stderr(&o));
            let verify = run(t.root(), &["verify"]);
            assert!(!verify.status.success(), "{kind} at {name}: verify passed");
            assert_eq!(object_files(&t), before, "{kind} at {name}: nothing was deleted");
        }
    }
}

#[test]
fn head_as_a_fifo_is_an_error_not_a_wait() {
    let t = repo_with_history();
    let before = object_files(&t);
    damage("fifo", &t.path(".ckpt/HEAD"));
    for args in [&["verify"][..], &["gc", "--prune=now"][..], &["log"][..]] {
        let o = run(t.root(), args);
        assert!(!o.status.success(), "ckpt {args:?} went ahead: {}", stderr(&o));
        let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
        assert!(said.contains(".ckpt/HEAD") && said.contains("FIFO"), "ckpt {args:?} names HEAD: {said}");
    }
    assert_eq!(object_files(&t), before);
}
