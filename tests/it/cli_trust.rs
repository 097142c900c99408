//! The core CLI under hostile or unusual input (issue 24, "Core CLI"): outputs that are links,
//! devices or pipes; versions whose paths cannot coexist; odd lock timeouts; control characters
//! in repository strings; diffs of non-tensor files; symlinked inputs; directories in the way of
//! files; all-or-nothing `checkout --output`; deleting and moving branches and tags.

use crate::support::repo_util::{ckpt_command, ckpt_in, ok, output_within, refused, stderr, TestRepo};
use crate::support::util::{noise, safetensors_file};
use ckpt::Dtype;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

fn model(seed: u64) -> Vec<u8> {
    safetensors_file(seed, &[("a", Dtype::F32, &[32, 8]), ("b", Dtype::F32, &[64])])
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
    // A private null device when root can make one (mknod) and open it (not on a `nodev`
    // mount), so a regression cannot replace the machine's /dev/null; /dev/null itself otherwise.
    let private = d.join("null");
    let usable = is_root()
        && std::process::Command::new("mknod").arg(&private).args(["c", "1", "3"]).status().is_ok_and(|s| s.success())
        && std::fs::OpenOptions::new().write(true).open(&private).is_ok();
    let null = if usable { private } else { Path::new("/dev/null").to_path_buf() };
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
}

// ---- 2. a file and a path under it ---------------------------------------------------------

/// A commit whose version would hold both `a` and `a/b` (here `a` kept from the parent) is
/// refused naming both, and nothing is committed.
#[test]
fn a_commit_holding_a_file_and_a_path_under_it_is_refused() {
    let t = TestRepo::init();
    t.write("a", b"file a");
    ok(&t, &["commit", "-m", "a", "a"]);
    std::fs::remove_file(t.path("a")).unwrap();
    t.write("a/b", b"file under a");
    let err = refused(&t, &["commit", "-m", "a/b", "a/b"]);
    assert!(err.contains("\"a\"") && err.contains("a/b") && err.contains("ckpt rm"), "{err}");
    assert_eq!(ok(&t, &["log", "--oneline"]).lines().count(), 1, "nothing committed");
    // Once `a` is no longer tracked, the commit goes through and checks out.
    ok(&t, &["rm", "a"]);
    ok(&t, &["commit", "-m", "a/b", "a/b"]);
    let out = t.path("out");
    ok(&t, &["checkout", "HEAD", "--output", out.to_str().unwrap()]);
    assert_eq!(std::fs::read(out.join("a/b")).unwrap(), b"file under a");
}

/// A version that holds both (not written by ckpt: crafted, or fetched) fails to check out
/// with a clear error, and writes nothing, into the tree or an output directory.
#[test]
fn checking_out_a_version_holding_a_file_and_a_path_under_it_writes_nothing() {
    let t = TestRepo::init();
    t.write("a", b"file a");
    t.write("x/b", b"file b");
    ok(&t, &["commit", "-m", "v1", "a", "x/b"]);
    let repo = t.open();
    let head = repo.head_version().unwrap().unwrap();
    let mut v = repo.version(&head).unwrap();
    v.files[1].path = "a/b".into();
    v.message = "hostile".into();
    let w = repo
        .store()
        .write_data(ckpt::store::ObjectKind::Version, &v.to_bytes(), &ckpt::codec::Options::default())
        .unwrap();
    std::fs::write(t.path(".ckpt/refs/tags/evil"), format!("{}\n", w.id)).unwrap();
    drop(repo);
    let err = refused(&t, &["checkout", "evil", "--output", "out"]);
    assert!(err.contains("\"a\"") && err.contains("a/b"), "{err}");
    assert!(!t.path("out").exists() || std::fs::read_dir(t.path("out")).unwrap().next().is_none(), "out is empty");
    std::fs::remove_dir_all(t.path("x")).unwrap();
    std::fs::remove_file(t.path("a")).unwrap();
    let err = refused(&t, &["checkout", "evil", "--force"]);
    assert!(err.contains("a/b"), "{err}");
    assert!(!t.path("a").exists() && !t.path("x").exists(), "nothing written into the tree");
}

// ---- 6. symlinked inputs -------------------------------------------------------------------

fn states(t: &TestRepo) -> Vec<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(&ok(t, &["status", "--json"])).unwrap();
    v["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["path"].as_str().unwrap().to_string(), f["state"].as_str().unwrap().to_string()))
        .collect()
}

/// A tracked path that is a symbolic link is committed as its target's bytes, and `status`
/// compares it the same way: clean after the commit, modified once the target changes.
#[test]
fn a_symlinked_input_is_clean_after_its_commit_and_modified_when_its_target_changes() {
    let t = TestRepo::init();
    std::fs::create_dir(t.path("runs")).unwrap();
    t.write("runs/epoch1.safetensors", &model(1));
    std::os::unix::fs::symlink("runs/epoch1.safetensors", t.path("latest.safetensors")).unwrap();
    ok(&t, &["commit", "-m", "v1", "latest.safetensors"]);
    assert_eq!(states(&t), vec![("latest.safetensors".to_string(), "unchanged".to_string())]);
    t.write("runs/epoch1.safetensors", &model(2));
    assert_eq!(states(&t), vec![("latest.safetensors".to_string(), "modified".to_string())]);
    // Pointing the link at other bytes is a change too; back at the committed bytes, clean.
    t.write("runs/epoch2.safetensors", &model(1));
    std::fs::remove_file(t.path("latest.safetensors")).unwrap();
    std::os::unix::fs::symlink("runs/epoch2.safetensors", t.path("latest.safetensors")).unwrap();
    assert_eq!(states(&t), vec![("latest.safetensors".to_string(), "unchanged".to_string())]);
    // A link that leads nowhere: the file is missing.
    std::fs::remove_file(t.path("runs/epoch2.safetensors")).unwrap();
    assert_eq!(states(&t), vec![("latest.safetensors".to_string(), "missing".to_string())]);
}

// ---- 7. a directory where the target version has a file ----------------------------------

/// `switch` to a branch with a file `a` where the working tree has a directory `a`: the
/// directory goes when it holds only tracked, unmodified files; with untracked files it is
/// refused naming them (as git does), and `--force` deletes it (as `git checkout -f` does).
#[test]
fn switch_turns_a_directory_into_a_file_like_git() {
    let t = TestRepo::init();
    t.write("a", b"file a");
    ok(&t, &["commit", "-m", "a is a file", "a"]);
    ok(&t, &["branch", "dir"]);
    ok(&t, &["switch", "dir"]);
    ok(&t, &["rm", "a"]);
    std::fs::remove_file(t.path("a")).unwrap();
    t.write("a/b", b"file a/b");
    ok(&t, &["commit", "-m", "a is a directory", "a/b"]);
    // Only tracked files in it: removed, no --force needed.
    ok(&t, &["switch", "main"]);
    assert_eq!(t.read("a"), b"file a");
    ok(&t, &["switch", "dir"]);
    assert_eq!(t.read("a/b"), b"file a/b");
    // An untracked file in it: refused, naming it; nothing changed.
    t.write("a/notes.txt", b"mine");
    let err = refused(&t, &["switch", "main"]);
    assert!(err.contains("notes.txt") && err.contains("--force"), "{err}");
    assert_eq!(t.read("a/notes.txt"), b"mine");
    assert_eq!(t.read("a/b"), b"file a/b");
    assert!(ok(&t, &["status"]).contains("dir"), "still on branch dir");
    // --force deletes the directory.
    ok(&t, &["switch", "main", "--force"]);
    assert_eq!(t.read("a"), b"file a");
    // And a file (untracked) where a directory is needed goes with --force too.
    ok(&t, &["rm", "a"]);
    ok(&t, &["switch", "dir", "--force"]);
    assert_eq!(t.read("a/b"), b"file a/b");
}

// ---- 8. checkout --output: all or nothing, no silent overwrite ------------------------------

/// `checkout --output` writes every file or none (a damaged object of the last file leaves
/// the directory as it was), and does not overwrite files there that hold other bytes unless
/// `--force`, naming them; files already holding the version's bytes are fine.
#[test]
fn checkout_output_is_all_or_nothing_and_does_not_overwrite_changes() {
    let t = TestRepo::init();
    t.write("a.safetensors", &model(1));
    t.write("z.bin", &noise(7, 50_000));
    ok(&t, &["commit", "-m", "v1", "a.safetensors", "z.bin"]);
    t.write("a.safetensors", &model(2));
    ok(&t, &["commit", "-m", "v2", "a.safetensors"]);
    ok(&t, &["checkout", "HEAD~1", "--output", "out"]);
    assert_eq!(std::fs::read(t.path("out/a.safetensors")).unwrap(), model(1));
    // Again: the files hold the version's bytes, nothing to refuse.
    ok(&t, &["checkout", "HEAD~1", "--output", "out"]);
    // A changed file of the same length, and one of another length.
    let mut mine = model(1);
    let n = mine.len() - 2;
    mine[n] ^= 0x55;
    std::fs::write(t.path("out/a.safetensors"), &mine).unwrap();
    std::fs::write(t.path("out/z.bin"), b"notes").unwrap();
    let err = refused(&t, &["checkout", "HEAD~1", "--output", "out"]);
    assert!(err.contains("a.safetensors") && err.contains("z.bin") && err.contains("--force"), "{err}");
    assert_eq!(std::fs::read(t.path("out/a.safetensors")).unwrap(), mine);
    assert_eq!(std::fs::read(t.path("out/z.bin")).unwrap(), b"notes");
    let err = refused(&t, &["checkout", "HEAD~1", "--output", "out", "a.safetensors"]);
    assert!(err.contains("a.safetensors") && !err.contains("z.bin"), "{err}");
    ok(&t, &["checkout", "HEAD~1", "--output", "out", "--force"]);
    assert_eq!(std::fs::read(t.path("out/a.safetensors")).unwrap(), model(1));
    assert_eq!(std::fs::read(t.path("out/z.bin")).unwrap(), noise(7, 50_000));
    // A damaged object of z.bin (written after a.safetensors): nothing is written at all.
    let repo = t.open();
    let head = repo.head_version().unwrap().unwrap();
    let v = repo.version(&head).unwrap();
    let manifest = repo.manifest(&v.file("z.bin").unwrap().manifest).unwrap();
    for blob in manifest.blobs() {
        let path = repo.store().object_path(&blob);
        let mut bytes = std::fs::read(&path).unwrap();
        let i = bytes.len() - 10;
        bytes[i] ^= 0xff;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        std::fs::write(&path, bytes).unwrap();
    }
    drop(repo);
    let err = refused(&t, &["checkout", "HEAD", "--output", "fresh"]);
    assert!(err.contains("z.bin"), "{err}");
    let left: Vec<_> = std::fs::read_dir(t.path("fresh")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "nothing written: {left:?}");
}

// ---- 4. control characters in repository strings -------------------------------------------

/// Messages, file names and tensor names (all of which can come from a remote) print with
/// control characters escaped in every human-readable output; `--json` keeps them exact.
#[test]
fn control_characters_from_the_repository_are_escaped_in_human_output() {
    let t = TestRepo::init();
    let evil_name = "evil\x1b[2Jname\u{202e}.bin";
    let evil_tensor = "w\x1b]0;pwned\x07";
    t.write(evil_name, b"opaque bytes");
    t.write("m.safetensors", &safetensors_file(1, &[(evil_tensor, Dtype::F32, &[16])]));
    let message = "subject \x1b[31mred\x1b[0m\nbody line\twith tab\r\x1b[1Aup";
    ok(&t, &["commit", "-m", message, evil_name, "m.safetensors"]);
    t.write("m.safetensors", &safetensors_file(2, &[(evil_tensor, Dtype::F32, &[16])]));
    t.write(evil_name, b"other bytes!");
    ok(&t, &["commit", "-m", message, evil_name, "m.safetensors"]);
    t.write(evil_name, b"changed again");
    let outputs = [
        ok(&t, &["log"]),
        ok(&t, &["log", "--oneline"]),
        ok(&t, &["show"]),
        ok(&t, &["status"]),
        ok(&t, &["diff", "HEAD~1", "HEAD"]),
    ];
    for out in &outputs {
        for bad in ['\x1b', '\x07', '\r', '\u{202e}'] {
            assert!(!out.contains(bad), "{bad:?} printed raw in:\n{out}");
        }
    }
    assert!(
        outputs[0].contains("subject \\x1b[31mred") && outputs[0].contains("body line\twith tab"),
        "{}",
        outputs[0]
    );
    assert!(outputs[2].contains("w\\x1b]0;pwned\\x07"), "{}", outputs[2]);
    assert!(outputs[3].contains("evil\\x1b[2Jname\\u{202e}.bin"), "{}", outputs[3]);
    // An error naming such a path too.
    std::fs::remove_file(t.path(evil_name)).unwrap();
    let err = refused(&t, &["commit", "-m", "x", evil_name]);
    assert!(!err.contains('\x1b') && err.contains("\\x1b"), "{err}");
    // JSON stays exact.
    let log: serde_json::Value = serde_json::from_str(&ok(&t, &["log", "--json"])).unwrap();
    assert_eq!(log[0]["message"], message);
    assert!(log[0]["files"].as_array().unwrap().iter().any(|f| f == evil_name));
}

// ---- 5. diff lists non-tensor changes -------------------------------------------------------

/// `diff` lists every file whose bytes differ, with sizes: opaque files, and safetensors
/// files whose tensors are equal but whose header differs, as well as added and removed files.
#[test]
fn diff_lists_changed_files_that_are_not_tensors() {
    let t = TestRepo::init();
    t.write("config.json", b"{\"lr\": 0.1}");
    t.write("m.safetensors", &model(1));
    t.write("gone.bin", &noise(1, 100));
    ok(&t, &["commit", "-m", "v1", "config.json", "m.safetensors", "gone.bin"]);
    t.write("config.json", b"{\"lr\": 0.05, \"wd\": 1}");
    // Same tensors, other metadata in the header.
    let st = model(1);
    let header_len = u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&st[8..8 + header_len]).unwrap();
    let new_header = header.replacen('{', "{\"__metadata__\":{\"step\":\"2\"},", 1);
    let mut st2 = (new_header.len() as u64).to_le_bytes().to_vec();
    st2.extend_from_slice(new_header.as_bytes());
    st2.extend_from_slice(&st[8 + header_len..]);
    t.write("m.safetensors", &st2);
    t.write("new.bin", &noise(2, 300));
    ok(&t, &["rm", "gone.bin"]);
    ok(&t, &["commit", "-m", "v2", "config.json", "m.safetensors", "new.bin"]);
    let out = ok(&t, &["diff", "HEAD~1", "HEAD"]);
    assert!(out.contains("file changed  config.json (11 B -> 21 B)"), "{out}");
    assert!(out.contains("file changed  m.safetensors") && out.contains("no tensor changed"), "{out}");
    assert!(out.contains("file added    new.bin (300 B)"), "{out}");
    assert!(out.contains("file removed  gone.bin (100 B)"), "{out}");
    assert!(out.contains("files: 2 changed, 1 added, 1 removed"), "{out}");
}

// ---- 9. deleting and moving branches and tags -----------------------------------------------

/// `branch -d/-D/-m`, `tag -d/-f`; a branch and a tag never share a name; an ambiguous name
/// (from an older repository) says so.
#[test]
fn branches_and_tags_can_be_deleted_and_moved_and_never_shadow_each_other() {
    let t = TestRepo::init();
    t.write("m.safetensors", &model(1));
    ok(&t, &["commit", "-m", "v1", "m.safetensors"]);
    ok(&t, &["branch", "side"]);
    ok(&t, &["switch", "side"]);
    t.write("m.safetensors", &model(2));
    ok(&t, &["commit", "-m", "v2 on side", "m.safetensors"]);
    ok(&t, &["switch", "main"]);
    // Deleting the current branch is refused; an unmerged one needs -D.
    let err = refused(&t, &["branch", "-d", "main"]);
    assert!(err.contains("HEAD is on it"), "{err}");
    let err = refused(&t, &["branch", "-d", "side"]);
    assert!(err.contains("-D") && err.contains("gc"), "{err}");
    ok(&t, &["tag", "keep", "side"]);
    ok(&t, &["branch", "-m", "side", "feature"]);
    assert!(refused(&t, &["log", "side"]).contains("side"));
    assert!(ok(&t, &["log", "feature"]).contains("v2 on side"));
    // Reachable from the tag now: -d deletes it and says where it was.
    let out = ok(&t, &["branch", "-d", "feature"]);
    assert!(out.contains("deleted branch feature (was "), "{out}");
    let branches: serde_json::Value = serde_json::from_str(&ok(&t, &["branch", "--json"])).unwrap();
    assert_eq!(branches.as_array().unwrap().len(), 1);
    assert_eq!(branches[0]["name"], "main");
    assert_eq!(branches[0]["current"], true);
    // Renaming the current branch moves HEAD along.
    ok(&t, &["branch", "-m", "main", "trunk"]);
    assert!(ok(&t, &["status"]).contains("On branch trunk"));
    // tag -f moves, tag -d deletes.
    let out = ok(&t, &["tag", "-f", "keep", "HEAD"]);
    assert!(out.contains("(was "), "{out}");
    assert!(refused(&t, &["tag", "keep"]).contains("already exists"));
    let tags: serde_json::Value = serde_json::from_str(&ok(&t, &["tag", "--json"])).unwrap();
    assert_eq!(tags[0]["name"], "keep");
    ok(&t, &["tag", "-d", "keep"]);
    assert!(refused(&t, &["tag", "-d", "keep"]).contains("no such tag"));
    // No namesakes.
    ok(&t, &["tag", "v1"]);
    assert!(refused(&t, &["branch", "v1"]).contains("a tag has this name"));
    assert!(refused(&t, &["branch", "-m", "trunk", "v1"]).contains("a tag has this name"));
    assert!(refused(&t, &["tag", "trunk"]).contains("a branch has this name"));
    assert!(refused(&t, &["tag", "-f", "trunk"]).contains("a branch has this name"));
    // A namesake made by an older ckpt (or by hand): ambiguous, unless spelled out.
    ok(&t, &["branch", "old", "HEAD"]);
    t.write("m.safetensors", &model(3));
    ok(&t, &["commit", "-m", "v3", "m.safetensors"]);
    let tip = ok(&t, &["log", "-n", "1", "--oneline"]);
    let head_id = tip.split_whitespace().next().unwrap();
    let full = t.open().resolve(head_id).unwrap();
    std::fs::write(t.path(".ckpt/refs/tags/old"), format!("{full}\n")).unwrap();
    let err = refused(&t, &["log", "old"]);
    assert!(err.contains("ambiguous") && err.contains("refs/tags/old"), "{err}");
    assert!(ok(&t, &["log", "refs/tags/old"]).contains("v3"));
    assert!(!ok(&t, &["log", "refs/heads/old"]).contains("v3"));
}
