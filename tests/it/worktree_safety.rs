//! The working tree is the only copy of a user's uncommitted bytes: `checkout` and `switch`
//! refuse to destroy them unless forced, `status` never calls a changed file unchanged, and
//! failures say what really happened (issue 18, items 1 and 6). Each test drives the CLI.

use crate::support::repo_util::{ckpt_in, ok, refused, stderr, TestRepo};
use crate::support::tmpfs::Tmpfs;
use crate::support::util::safetensors_file;
use ckpt::Dtype;
use std::io::BufRead;
use std::path::Path;
use std::process::Stdio;

/// A small safetensors file with tensors `a` and `b`; `seed` varies the values, not the size.
fn model(seed: u64) -> Vec<u8> {
    safetensors_file(seed, &[("a", Dtype::F32, &[64, 16]), ("b", Dtype::F32, &[256])])
}

/// The same bytes with one byte changed near the end (same size).
fn poked(bytes: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    let i = b.len() - 3;
    b[i] ^= 0x5a;
    b
}

/// A repository with `m.safetensors` committed twice (v1, then v2 at HEAD).
fn two_versions() -> (TestRepo, Vec<u8>, Vec<u8>) {
    let t = TestRepo::init();
    let (v1, v2) = (model(1), model(2));
    t.write("m.safetensors", &v1);
    ok(&t, &["commit", "-m", "v1", "m.safetensors"]);
    t.write("m.safetensors", &v2);
    ok(&t, &["commit", "-m", "v2", "m.safetensors"]);
    (t, v1, v2)
}

#[test]
fn checkout_over_a_modified_file_is_refused_and_force_overwrites() {
    let (t, v1, v2) = two_versions();
    let mine = poked(&v2);
    t.write("m.safetensors", &mine);
    for args in [&["checkout", "HEAD~1"][..], &["checkout", "HEAD~1", "m.safetensors"]] {
        let err = refused(&t, args);
        assert!(err.contains("m.safetensors") && err.contains("modified"), "{err}");
        assert_eq!(t.read("m.safetensors"), mine, "nothing written when refusing");
    }
    ok(&t, &["checkout", "HEAD~1", "--force"]);
    assert_eq!(t.read("m.safetensors"), v1);
    // What a checkout wrote is the repository's: going back needs no force, and an
    // unmodified file is no obstacle either.
    ok(&t, &["checkout", "HEAD"]);
    assert_eq!(t.read("m.safetensors"), v2);
    ok(&t, &["checkout", "HEAD~1"]);
    assert_eq!(t.read("m.safetensors"), v1);
}

#[test]
fn tensor_checkout_into_the_tree_needs_output_or_force() {
    let (t, _, v2) = two_versions();
    let err = refused(&t, &["checkout", "HEAD", "--tensor", "a"]);
    assert!(err.contains("m.safetensors") && err.contains("--output"), "{err}");
    assert_eq!(t.read("m.safetensors"), v2, "the whole model is still there");
    ok(&t, &["checkout", "HEAD", "--tensor", "a", "--output", "only_a"]);
    let subset = t.read("only_a/m.safetensors");
    assert!(subset.len() < v2.len());
    ok(&t, &["checkout", "HEAD", "--tensor", "a", "--force"]);
    assert_eq!(t.read("m.safetensors"), subset);
}

#[test]
fn switch_removes_what_the_target_lacks_and_keeps_untracked_files() {
    let (t, _, v2) = two_versions();
    ok(&t, &["branch", "base"]);
    let extra = model(7);
    t.write("sub/extra.safetensors", &extra);
    ok(&t, &["commit", "-m", "extra", "sub/extra.safetensors"]);

    // The old branch's file goes (and its directory, now empty); status is clean.
    ok(&t, &["switch", "base"]);
    assert!(!t.path("sub/extra.safetensors").exists() && !t.path("sub").exists());
    let status = ok(&t, &["status"]);
    assert!(status.contains("1 of 1 tracked files unchanged"), "{status}");
    ok(&t, &["switch", "main"]);
    assert_eq!(t.read("sub/extra.safetensors"), extra);

    // A modified file the target lacks is not removed.
    ok(&t, &["switch", "base"]);
    ok(&t, &["switch", "main"]);
    t.write("sub/extra.safetensors", &poked(&extra));
    let err = refused(&t, &["switch", "base"]);
    assert!(err.contains("sub/extra.safetensors"), "{err}");
    assert_eq!(t.read("sub/extra.safetensors"), poked(&extra));
    ok(&t, &["switch", "base", "--force"]);
    assert!(!t.path("sub/extra.safetensors").exists());

    // On the way back, an untracked file of the user's in the way is not overwritten.
    let users = b"the user's own file".to_vec();
    t.write("sub/extra.safetensors", &users);
    let err = refused(&t, &["switch", "main"]);
    assert!(err.contains("untracked") && err.contains("sub/extra.safetensors"), "{err}");
    assert_eq!(t.read("sub/extra.safetensors"), users);
    assert_eq!(t.read("m.safetensors"), v2);
    let status = ok(&t, &["status"]);
    assert!(status.contains("On branch base"), "HEAD did not move: {status}");
    assert!(status.contains("untracked sub/extra.safetensors (tracked by branch main"), "{status}");
    ok(&t, &["switch", "main", "--force"]);
    assert_eq!(t.read("sub/extra.safetensors"), extra);
}

/// A same-size rewrite whose mtime is put back (`touch -d`) keeps size and mtime: only the
/// ctime (and inode, for a file replaced by rename) shows it.
#[test]
fn same_size_rewrite_with_restored_mtime_is_caught() {
    let (t, _, v2) = two_versions();
    ok(&t, &["branch", "older", "HEAD~1"]);
    let path = t.path("m.safetensors");
    let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
    std::fs::File::options().write(true).open(&path).unwrap().set_modified(old).unwrap();
    // Past the racy window (2 s), so that status trusts and records the file's identity rather
    // than hashing it every time.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    assert!(ok(&t, &["status"]).contains("1 of 1 tracked files unchanged"));

    let mine = poked(&v2);
    {
        use std::io::{Seek, Write};
        let mut f = std::fs::File::options().write(true).open(&path).unwrap();
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        f.write_all(&mine).unwrap();
        f.set_modified(old).unwrap();
    }
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!((meta.len(), meta.modified().unwrap()), (v2.len() as u64, old));
    let status = ok(&t, &["status"]);
    assert!(status.contains("modified") && status.contains("m.safetensors"), "{status}");
    let err = refused(&t, &["switch", "older"]);
    assert!(err.contains("m.safetensors"), "{err}");
    assert_eq!(t.read("m.safetensors"), mine);
}

/// `ckpt CMD | head -1`: the reader goes away after one line; ckpt must end quietly with 0.
fn first_line_then_close(dir: &Path, args: &[&str]) {
    let mut child = crate::support::repo_util::ckpt_command(dir, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(!line.is_empty());
    // The reader (and with it the pipe) is dropped here.
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "ckpt {args:?} after stdout closed: {:?}: {}", o.status, stderr(&o));
    assert!(o.stderr.is_empty(), "ckpt {args:?}: {}", stderr(&o));
}

#[test]
fn a_closed_stdout_ends_quietly() {
    let t = TestRepo::init();
    // Output well past a pipe's buffer (64 KiB): long messages for log, many tensors for show.
    let names: Vec<String> = (0..3000).map(|i| format!("layers.{i}.norm.weight")).collect();
    let shape: &[u64] = &[4];
    let tensors: Vec<(&str, Dtype, &[u64])> = names.iter().map(|n| (n.as_str(), Dtype::F32, shape)).collect();
    let message = "m".repeat(20_000);
    for seed in 0..12 {
        t.write("many.safetensors", &safetensors_file(seed, &tensors));
        ok(&t, &["commit", "-m", &message, "many.safetensors"]);
    }
    for args in [&["log"][..], &["log", "--json"], &["log", "--oneline"], &["show"], &["show", "--json"]] {
        first_line_then_close(t.root(), args);
    }
}

#[test]
fn output_into_the_repository_directory_is_refused() {
    let (t, _, _) = two_versions();
    std::os::unix::fs::symlink(".ckpt", t.path("link")).unwrap();
    std::fs::create_dir(t.path("out")).unwrap();
    let before = crate::support::util::list(&t.path(".ckpt"));
    for output in [".ckpt", ".ckpt/x", "link/y", "out/../.ckpt/refs", "link"] {
        let err = refused(&t, &["checkout", "HEAD", "--output", output]);
        assert!(err.contains("inside the repository's own directory"), "{output}: {err}");
    }
    assert_eq!(crate::support::util::list(&t.path(".ckpt")), before, "nothing created in .ckpt");
    assert!(ok(&t, &["log", "--oneline"]).lines().count() == 2, "the repository still works");
}

#[test]
fn a_file_where_a_directory_is_needed_is_named_as_such() {
    let t = TestRepo::init();
    t.write("d/a.bin", b"one");
    ok(&t, &["commit", "-m", "v", "d/a.bin"]);
    t.write("f", b"a file");
    for output in ["f", "f/sub"] {
        let err = refused(&t, &["checkout", "HEAD", "--output", output]);
        assert!(err.contains("is not a directory") && !err.contains("File exists"), "{err}");
    }
    // In the working tree: a file now stands where the version's directory was.
    std::fs::remove_dir_all(t.path("d")).unwrap();
    t.write("d", b"in the way");
    let err = refused(&t, &["checkout", "HEAD"]);
    assert!(err.contains("d is not a directory") && !err.contains("File exists"), "{err}");
    assert_eq!(t.read("d"), b"in the way");
    // A symbolic link there is refused before anything is written, never written through.
    std::fs::remove_file(t.path("d")).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), t.path("d")).unwrap();
    let err = refused(&t, &["checkout", "HEAD"]);
    assert!(err.contains("symbolic link"), "{err}");
    assert!(std::fs::read_dir(elsewhere.path()).unwrap().next().is_none());
}

#[test]
fn a_full_disk_is_reported_as_such() {
    let Some(fs) = Tmpfs::mount("1m") else { return };
    let root = fs.path();
    assert!(ckpt_in(root, &["init"]).status.success());
    // 600 KiB of noise: the file fits, a second copy in the store does not.
    let big = safetensors_file(3, &[("w", Dtype::U8, &[600 << 10])]);
    std::fs::write(root.join("m.safetensors"), &big).unwrap();
    let o = ckpt_in(root, &["commit", "-m", "too big", "m.safetensors"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("No space left on device") && err.contains("m.safetensors"), "{err}");
    assert!(!err.contains("invalid codec input"), "{err}");
    assert_eq!(std::fs::read(root.join("m.safetensors")).unwrap(), big);
}
