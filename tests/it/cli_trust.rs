//! The core CLI under hostile or unusual input (issue 24, "Core CLI"): outputs that are links,
//! devices or pipes; versions whose paths cannot coexist; odd lock timeouts; control characters
//! in repository strings; diffs of non-tensor files; symlinked inputs; directories in the way of
//! files; all-or-nothing `checkout --output`; deleting and moving branches and tags.

use crate::repo_util::{ckpt_command, ckpt_in, stderr, TestRepo};
use crate::util::{noise, safetensors_file};
use ckpt::Dtype;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

fn model(seed: u64) -> Vec<u8> {
    safetensors_file(seed, &[("a", Dtype::F32, &[32, 8]), ("b", Dtype::F32, &[64])])
}

fn ok(t: &TestRepo, args: &[&str]) -> String {
    let o = t.ckpt(args);
    assert!(o.status.success(), "ckpt {args:?}: {}", stderr(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn refused(t: &TestRepo, args: &[&str]) -> String {
    let o = t.ckpt(args);
    assert_eq!(o.status.code(), Some(1), "ckpt {args:?} should fail: {}", stderr(&o));
    stderr(&o)
}

/// Runs `command`, killing it after `limit`; `None` if it had to be killed.
fn output_within(mut command: std::process::Command, limit: Duration) -> Option<Output> {
    let mut child = command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Some(child.wait_with_output().unwrap())
}

fn run(dir: &Path, args: &[&str]) -> Output {
    ckpt_in(dir, args)
}

fn is_root() -> bool {
    std::process::Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

// ---- 1. outputs that are links, devices or pipes ----------------------------------------

/// `compress`/`decompress -o` into a character device streams into it (as `zstd -o /dev/null`
/// does) instead of renaming a file over it; as root, that replaced the device node.
#[test]
fn output_to_a_device_streams_into_it_and_keeps_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("m.safetensors"), model(1)).unwrap();
    assert!(run(d, &["compress", "m.safetensors", "-o", "m.ckz"]).status.success());
    // A private null device when root can make one (mknod), so a regression cannot replace the
    // machine's /dev/null; /dev/null itself otherwise.
    let null = if is_root() {
        let ok = std::process::Command::new("mknod").arg(d.join("null")).args(["c", "1", "3"]).status().unwrap();
        assert!(ok.success());
        d.join("null")
    } else {
        Path::new("/dev/null").to_path_buf()
    };
    for args in [["compress", "m.safetensors"], ["decompress", "m.ckz"]] {
        let o = run(d, &[args[0], args[1], "-o", null.to_str().unwrap()]);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        let t = std::fs::symlink_metadata(&null).unwrap().file_type();
        assert!(t.is_char_device(), "{args:?} replaced the device node: {t:?}");
    }
    // A directory or a socket is refused, naming it.
    std::fs::create_dir(d.join("sub")).unwrap();
    let o = run(d, &["decompress", "m.ckz", "-o", "sub"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("sub") && stderr(&o).contains("directory"), "{}", stderr(&o));
    let _socket = std::os::unix::net::UnixListener::bind(d.join("sock")).unwrap();
    let o = run(d, &["decompress", "m.ckz", "-o", "sock"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("socket"), "{}", stderr(&o));
    assert!(std::fs::symlink_metadata(d.join("sock")).unwrap().file_type().is_socket());
}

/// `-o LINK` writes the file the link leads to (atomically) and keeps the link, also for a
/// dangling link (its target is created) and a chain of links.
#[test]
fn output_through_a_symlink_updates_the_target_and_keeps_the_link() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = model(2);
    std::fs::write(d.join("m.safetensors"), &data).unwrap();
    assert!(run(d, &["compress", "m.safetensors", "-o", "m.ckz"]).status.success());
    std::fs::create_dir(d.join("real")).unwrap();
    std::fs::write(d.join("real/out"), b"old").unwrap();
    std::os::unix::fs::symlink("real/out", d.join("link")).unwrap();
    std::os::unix::fs::symlink("link", d.join("link2")).unwrap();
    std::os::unix::fs::symlink("real/new", d.join("dangling")).unwrap();
    for name in ["link", "link2", "dangling"] {
        let o = run(d, &["decompress", "m.ckz", "-o", name]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        assert!(std::fs::symlink_metadata(d.join(name)).unwrap().file_type().is_symlink(), "{name} was replaced");
    }
    assert_eq!(std::fs::read(d.join("real/out")).unwrap(), data);
    assert_eq!(std::fs::read(d.join("real/new")).unwrap(), data);
    let names: Vec<_> = std::fs::read_dir(d.join("real")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 2, "no temporary file left: {names:?}");
}

/// `-o FIFO` streams into the pipe when a process reads it, and fails at once, saying so,
/// when none does (instead of waiting for a reader forever).
#[test]
fn output_to_a_named_pipe_streams_or_fails_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = model(3);
    std::fs::write(d.join("m.safetensors"), &data).unwrap();
    assert!(run(d, &["compress", "m.safetensors", "-o", "m.ckz"]).status.success());
    let fifo = d.join("fifo");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let o = output_within(ckpt_command(d, &["decompress", "m.ckz", "-o", "fifo"]), Duration::from_secs(10))
        .expect("decompress -o FIFO without a reader hung");
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("fifo") && stderr(&o).contains("no process is reading"), "{}", stderr(&o));
    // With a reader.
    let reader = std::thread::spawn({
        let fifo = fifo.clone();
        move || std::fs::read(fifo).unwrap()
    });
    // The reader opens the pipe first (a writer with no reader is refused, as above).
    let start = Instant::now();
    let o = loop {
        let o = output_within(ckpt_command(d, &["decompress", "m.ckz", "-o", "fifo"]), Duration::from_secs(10))
            .expect("decompress -o FIFO hung");
        if o.status.success() || start.elapsed() > Duration::from_secs(5) {
            break o;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(reader.join().unwrap(), data);
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
}

// ---- 3. lock timeouts ---------------------------------------------------------------------

/// `CKPT_LOCK_TIMEOUT` beyond what a `Duration` holds waits forever instead of panicking;
/// negative or non-numbers are refused with a message naming the variable.
#[test]
fn huge_lock_timeouts_wait_forever_and_bad_ones_are_refused() {
    let t = TestRepo::init();
    t.write("m.safetensors", &model(1));
    ok(&t, &["commit", "-m", "v1", "m.safetensors"]);
    for (value, tag) in [("1e20", "t1"), ("inf", "t2"), ("1e308", "t3"), (" 2.5 ", "t4")] {
        let o = ckpt_command(t.root(), &["tag", tag]).env("CKPT_LOCK_TIMEOUT", value).output().unwrap();
        assert!(o.status.success(), "CKPT_LOCK_TIMEOUT={value}: {}", stderr(&o));
    }
    for value in ["-1", "NaN", "soon", ""] {
        let o = ckpt_command(t.root(), &["tag", "bad"]).env("CKPT_LOCK_TIMEOUT", value).output().unwrap();
        assert_eq!(o.status.code(), Some(1), "CKPT_LOCK_TIMEOUT={value:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("CKPT_LOCK_TIMEOUT"), "{}", stderr(&o));
    }
    let _ = noise(0, 1);
}
