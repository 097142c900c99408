//! The working tree, round 2 (issue 39): nothing is tracked, written or deleted through a
//! symbolic link to a directory (item 3); `checkout` and `switch` are all or nothing, a failure
//! part-way undoing what was done (item 4); their refusals print a path holding a newline
//! escaped, as `status` does (item 9). Each test drives the CLI.

use crate::support::repo_util::{ok, refused, TestRepo};
use std::path::Path;
use std::process::Command;

/// `ckpt log --oneline` line count: how many versions the branch has.
fn versions(t: &TestRepo) -> usize {
    ok(t, &["log", "--oneline"]).lines().count()
}

/// The regular files under `dir`, relative and sorted, with their bytes (links not followed).
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            if rel == ".ckpt" {
                continue;
            }
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() {
                out.push((rel, std::fs::read(&path).unwrap()));
            } else {
                out.push((rel, b"<link>".to_vec()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_path_beyond_a_symlinked_directory_is_not_committed() {
    let t = TestRepo::init();
    t.write("a.bin", b"base");
    ok(&t, &["commit", "-m", "base", "a.bin"]);
    let ext = tempfile::tempdir().unwrap();
    std::fs::write(ext.path().join("x.bin"), b"outside").unwrap();
    std::os::unix::fs::symlink(ext.path(), t.path("sub")).unwrap();
    let err = refused(&t, &["commit", "-m", "through", "sub/x.bin"]);
    assert!(err.contains("beyond a symbolic link") && err.contains("sub"), "{err}");
    // Named as a directory, the link is refused as one found inside a directory is.
    let err = refused(&t, &["commit", "-m", "through", "sub"]);
    assert!(err.contains("symbolic link to a directory"), "{err}");
    // Deeper, and by an absolute path.
    std::fs::create_dir(ext.path().join("deep")).unwrap();
    std::fs::write(ext.path().join("deep/y.bin"), b"outside too").unwrap();
    let abs = t.path("sub/deep/y.bin");
    let err = refused(&t, &["commit", "-m", "through", abs.to_str().unwrap()]);
    assert!(err.contains("beyond a symbolic link"), "{err}");
    assert_eq!(versions(&t), 1, "nothing committed");
    assert_eq!(std::fs::read(ext.path().join("x.bin")).unwrap(), b"outside");
}

#[test]
fn switch_and_checkout_never_delete_or_write_through_a_symlinked_directory() {
    // A version that tracks sub/x.bin from when sub was a directory (or from another machine).
    let t = TestRepo::init();
    t.write("a.bin", b"base");
    ok(&t, &["commit", "-m", "base", "a.bin"]);
    ok(&t, &["branch", "base"]);
    t.write("sub/x.bin", b"tracked");
    ok(&t, &["commit", "-m", "sub", "sub/x.bin"]);
    // Then sub is moved elsewhere and linked back: the same bytes, outside the working tree.
    let ext = tempfile::tempdir().unwrap();
    std::fs::remove_dir_all(t.path("sub")).unwrap();
    std::fs::write(ext.path().join("x.bin"), b"tracked").unwrap();
    std::os::unix::fs::symlink(ext.path(), t.path("sub")).unwrap();
    // Neither switch nor a forced one deletes it where the link leads.
    ok(&t, &["switch", "base"]);
    assert_eq!(std::fs::read(ext.path().join("x.bin")).unwrap(), b"tracked", "deleted through the link");
    std::fs::remove_file(t.path("sub")).unwrap();
    ok(&t, &["switch", "main"]);
    std::fs::remove_dir_all(t.path("sub")).unwrap();
    std::os::unix::fs::symlink(ext.path(), t.path("sub")).unwrap();
    // The file is not in the working tree (git's rule): status says so.
    let status = ok(&t, &["status"]);
    assert!(status.contains("missing   sub/x.bin"), "{status}");
    ok(&t, &["switch", "--force", "base"]);
    assert_eq!(std::fs::read(ext.path().join("x.bin")).unwrap(), b"tracked", "deleted through the link");
    // Nor is anything written there: back to main (which has sub/x.bin) is refused, naming the link.
    std::fs::remove_file(ext.path().join("x.bin")).unwrap();
    for args in [&["switch", "main"][..], &["checkout", "main"], &["checkout", "main", "sub/x.bin"]] {
        let err = refused(&t, args);
        assert!(err.contains("symbolic link") && err.contains("sub"), "{args:?}: {err}");
        assert!(tree(ext.path()).is_empty(), "{args:?} wrote through the link");
    }
    assert!(ok(&t, &["status"]).starts_with("On branch base"));
    // Without the link, the switch goes through.
    std::fs::remove_file(t.path("sub")).unwrap();
    ok(&t, &["switch", "main"]);
    assert_eq!(t.read("sub/x.bin"), b"tracked");
}

/// A file made so that it cannot be renamed or replaced: immutable (`chattr +i`; root
/// included), or, where that is not supported and the tests do not run as root, in a
/// read-only directory. Undone when dropped.
struct Stuck {
    path: std::path::PathBuf,
    how: &'static str,
}

impl Stuck {
    fn make(path: &Path) -> Option<Stuck> {
        let chattr = Command::new("chattr").arg("+i").arg(path).output();
        if chattr.is_ok_and(|o| o.status.success()) {
            return Some(Stuck { path: path.to_path_buf(), how: "chattr" });
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            let dir = path.parent().unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).unwrap();
            return Some(Stuck { path: dir.to_path_buf(), how: "chmod" });
        }
        None
    }
}

impl Drop for Stuck {
    fn drop(&mut self) {
        if self.how == "chattr" {
            let _ = Command::new("chattr").arg("-i").arg(&self.path).status();
        } else {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(0o755));
        }
    }
}

#[test]
fn a_switch_that_fails_part_way_undoes_what_it_did() {
    let t = TestRepo::init();
    // Branch other: a.bin and z/m.bin with other bytes, d/n.bin new, no b.bin.
    t.write("a.bin", b"a other");
    t.write("z/m.bin", b"m other");
    t.write("d/n.bin", b"n other");
    ok(&t, &["commit", "-m", "other", "a.bin", "z/m.bin", "d/n.bin"]);
    ok(&t, &["branch", "other"]);
    ok(&t, &["rm", "d/n.bin"]);
    std::fs::remove_dir_all(t.path("d")).unwrap();
    t.write("a.bin", b"a main");
    t.write("b.bin", b"b main");
    t.write("z/m.bin", b"m main");
    ok(&t, &["commit", "-m", "main", "a.bin", "b.bin", "z/m.bin"]);
    let before = tree(t.root());
    // In path order, a switch to other removes b.bin, then writes a.bin and d/n.bin (creating
    // d), then fails on z/m.bin.
    let Some(stuck) = Stuck::make(&t.path("z/m.bin")) else {
        crate::support::skip(
            "chattr +i is not supported here, and as root a read-only directory stops nothing",
            "CKPT_REQUIRE_CHATTR",
        );
        return;
    };
    for args in [&["switch", "other"][..], &["switch", "--force", "other"], &["checkout", "other"]] {
        let err = refused(&t, args);
        assert_eq!(tree(t.root()), before, "{args:?} left the working tree half switched: {err}");
        assert!(err.contains("z/m.bin") && err.contains("nothing was changed"), "{args:?}: {err}");
        let status = ok(&t, &["status"]);
        assert!(status.starts_with("On branch main") && status.contains("3 of 3 tracked files unchanged"), "{status}");
    }
    assert!(tree(&t.path(".ckpt/tmp")).is_empty(), "nothing left set aside");
    drop(stuck);
    ok(&t, &["switch", "other"]);
    let other: Vec<(String, Vec<u8>)> = [("a.bin", "a other"), ("d/n.bin", "n other"), ("z/m.bin", "m other")]
        .iter()
        .map(|(p, b)| (p.to_string(), b.as_bytes().to_vec()))
        .collect();
    assert_eq!(tree(t.root()), other);
    ok(&t, &["switch", "main"]);
    assert_eq!(tree(t.root()), before);
}

#[test]
fn switch_and_checkout_refusals_escape_a_newline_in_a_path_as_status_does() {
    let t = TestRepo::init();
    t.write("a.bin", b"base");
    ok(&t, &["commit", "-m", "base", "a.bin"]);
    ok(&t, &["branch", "base"]);
    let name = "evil\nerror: all is fine.bin";
    t.write(name, b"one");
    ok(&t, &["commit", "-m", "evil", name]);
    t.write(name, b"two");
    let status = ok(&t, &["status"]);
    assert!(status.contains("modified  evil\\nerror: all is fine.bin"), "{status}");
    // Modified: a switch to a branch without it refuses to remove it.
    let err = refused(&t, &["switch", "base"]);
    assert!(err.contains("evil\\nerror: all is fine.bin"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // Untracked where the version has a file: a checkout refuses to overwrite it.
    ok(&t, &["switch", "--force", "base"]);
    t.write(name, b"mine");
    let err = refused(&t, &["checkout", "main"]);
    assert!(err.contains("evil\\nerror: all is fine.bin"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}
