//! When the watcher commits: what `HEAD` holds decides (A, B, A commits A again, also after a
//! restart); a checkpoint is committed only when complete (pieces written with pauses, files
//! still open for writing, `trainer_state.json` no shortcut); skipped paths are reported once.

use crate::repo_watch::{committed, options, SETTLE};
use crate::support::repo_util::{ckpt_command, stderr, TestRepo};
use ckpt::repo::Repo;
use ckpt::watch::{watch, WatchEvent, WatchOptions, Watcher};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

fn skipped(events: &[WatchEvent]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            WatchEvent::Skipped { path, reason } => Some((path.clone(), reason.clone())),
            _ => None,
        })
        .collect()
}

/// The content of `path` in `HEAD`.
fn in_head(t: &TestRepo, repo: &Repo, path: &str) -> Option<Vec<u8>> {
    t.checkout_all(repo, "HEAD").into_iter().find(|(p, _)| p == path).map(|(_, b)| b)
}

#[test]
fn a_file_rewritten_back_to_earlier_content_is_committed_again_also_after_a_restart() {
    let t = TestRepo::init();
    std::fs::create_dir(t.path("c")).unwrap();
    let t0 = Instant::now();
    let settle_and_step = |w: &mut Watcher, at: Instant| {
        w.step(at).unwrap();
        w.step(at + SETTLE).unwrap()
    };
    let repo = t.open();
    {
        let mut w = Watcher::new(&repo, &t.path("c"), options()).unwrap();
        for (n, content) in [b"weights A", b"weights B", b"weights A"].iter().enumerate() {
            t.write("c/last.ckpt", *content);
            let e = settle_and_step(&mut w, t0 + 2 * SETTLE * n as u32);
            assert_eq!(committed(&e), vec!["c/last.ckpt"], "write {n}: {e:?}");
            assert_eq!(in_head(&t, &repo, "c/last.ckpt").unwrap(), *content, "write {n}");
        }
    }
    // Rewritten to B by a run without a watcher, committed by one; then back to A while no
    // watcher runs: the next one commits A although A was committed (and logged) before.
    for content in [b"weights B", b"weights A"] {
        t.write("c/last.ckpt", content);
        let mut w = Watcher::new(&repo, &t.path("c"), options()).unwrap();
        let e = settle_and_step(&mut w, t0);
        assert_eq!(committed(&e), vec!["c/last.ckpt"], "{e:?}");
        assert_eq!(in_head(&t, &repo, "c/last.ckpt").unwrap(), content);
    }
    // And nothing twice.
    let mut w = Watcher::new(&repo, &t.path("c"), options()).unwrap();
    let e = settle_and_step(&mut w, t0);
    assert!(committed(&e).is_empty(), "{e:?}");
    assert!(matches!(&e[..], [WatchEvent::AlreadyCommitted { .. }]), "{e:?}");
    assert_eq!(repo.log("HEAD").unwrap().len(), 5);
}

#[test]
fn a_file_open_for_writing_waits_for_its_close_or_several_settle_times() {
    let t = TestRepo::init();
    let repo = t.open();
    std::fs::create_dir(t.path("w")).unwrap();
    let mut w = Watcher::new(&repo, &t.path("w"), options()).unwrap();
    let t0 = Instant::now();
    // A writer that pauses longer than the settle time between two pieces, the file open.
    t.write("w/state.json", b"{\"step\": 1");
    w.file_written(&t.path("w/state.json"));
    w.step(t0).unwrap();
    assert!(committed(&w.step(t0 + 2 * SETTLE).unwrap()).is_empty(), "committed while open");
    let mut f = std::fs::OpenOptions::new().append(true).open(t.path("w/state.json")).unwrap();
    f.write_all(b", \"done\": true}").unwrap();
    drop(f);
    w.step(t0 + 2 * SETTLE).unwrap();
    assert!(committed(&w.step(t0 + 4 * SETTLE).unwrap()).is_empty(), "committed while open");
    w.file_closed(&t.path("w/state.json"));
    assert_eq!(committed(&w.step(t0 + 4 * SETTLE).unwrap()), vec!["w/state.json"]);
    assert_eq!(in_head(&t, &repo, "w/state.json").unwrap(), b"{\"step\": 1, \"done\": true}");

    // A close that never comes (a writer keeping an idle file open, a lost event) holds a
    // checkpoint back for a while, not forever.
    t.write("w/held.bin", b"held");
    w.file_written(&t.path("w/held.bin"));
    let t1 = t0 + 5 * SETTLE;
    w.step(t1).unwrap();
    assert!(committed(&w.step(t1 + 3 * SETTLE).unwrap()).is_empty());
    assert_eq!(committed(&w.step(t1 + 6 * SETTLE).unwrap()), vec!["w/held.bin"]);
    // Lost events: what is open is forgotten, the settle time alone decides.
    t.write("w/other.bin", b"other");
    w.file_written(&t.path("w/other.bin"));
    w.forget_open_files();
    let t2 = t1 + 7 * SETTLE;
    w.step(t2).unwrap();
    assert_eq!(committed(&w.step(t2 + SETTLE).unwrap()), vec!["w/other.bin"]);
}

#[test]
fn a_trainer_folder_is_committed_when_settled_not_when_trainer_state_appears() {
    let t = TestRepo::init();
    let repo = t.open();
    std::fs::create_dir(t.path("run")).unwrap();
    let mut w = Watcher::new(&repo, &t.path("run"), options()).unwrap();
    let t0 = Instant::now();
    let state = br#"{"global_step": 1500, "log_history": [{"loss": 0.5}]}"#;
    t.write("run/checkpoint-1500/model.safetensors", &crate::support::util::all_dtypes_file(3));
    // trainer_state.json half written.
    t.write("run/checkpoint-1500/trainer_state.json", &state[..20]);
    let e = w.step(t0).unwrap();
    assert!(committed(&e).is_empty(), "a folder with a half-written trainer_state.json was committed: {e:?}");
    // The rest of it, and (older Trainer versions) rng_state.pth after it.
    let half = t0 + SETTLE / 2;
    t.write("run/checkpoint-1500/trainer_state.json", state);
    assert!(committed(&w.step(half).unwrap()).is_empty());
    t.write("run/checkpoint-1500/rng_state.pth", b"rng");
    assert!(committed(&w.step(half + SETTLE / 2).unwrap()).is_empty());
    let e = w.step(half + SETTLE / 2 + SETTLE).unwrap();
    assert_eq!(committed(&e), vec!["run/checkpoint-1500"]);
    assert!(matches!(e[0], WatchEvent::Committed { files: 3, .. }), "{e:?}");
    assert_eq!(repo.log("HEAD").unwrap().len(), 1);
    assert_eq!(in_head(&t, &repo, "run/checkpoint-1500/trainer_state.json").unwrap(), state);
}

/// Writes `pieces` to a new file at `path` through one open file, pausing `pause` between them.
fn write_in_pieces(path: &Path, pieces: &[&[u8]], pause: Duration) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut f = std::fs::File::create(path).unwrap();
    for (i, piece) in pieces.iter().enumerate() {
        if i > 0 {
            std::thread::sleep(pause);
        }
        f.write_all(piece).unwrap();
    }
}

const STATE: [&[u8]; 5] =
    [b"{\"global_step\": 1500, ", b"\"epoch\": 3.0, ", b"\"log_history\": [", b"{\"loss\": 0.5}", b"]}"];
const SLOW: [&[u8]; 3] = [b"slow ", b"but ", b"complete"];

#[test]
fn files_written_in_pieces_are_committed_whole() {
    let t = TestRepo::init();
    let repo = t.open();
    std::fs::create_dir(t.path("run")).unwrap();
    let root = t.root().to_path_buf();
    // The writers start once the watcher runs (its events set up, its first scan done), as a
    // trainer beside a running `ckpt watch` does.
    let started = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let go = started.clone();
    let writers = std::thread::spawn(move || {
        while !go.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let folder = std::thread::spawn({
            let root = root.clone();
            move || {
                std::fs::create_dir_all(root.join("run/checkpoint-1500")).unwrap();
                std::fs::write(
                    root.join("run/checkpoint-1500/model.safetensors"),
                    crate::support::util::all_dtypes_file(4),
                )
                .unwrap();
                // Pauses shorter than the settle time.
                write_in_pieces(
                    &root.join("run/checkpoint-1500/trainer_state.json"),
                    &STATE,
                    Duration::from_millis(250),
                );
            }
        });
        // Pauses longer than the settle time, the file open: only the close tells.
        write_in_pieces(&root.join("run/slow.json"), &SLOW, Duration::from_millis(800));
        folder.join().unwrap();
    });
    let done_at = std::cell::Cell::new(None::<Instant>);
    let stop = || {
        started.store(true, std::sync::atomic::Ordering::SeqCst);
        if writers.is_finished() && done_at.get().is_none() {
            done_at.set(Some(Instant::now()));
        }
        done_at.get().is_some_and(|d| d.elapsed() > Duration::from_millis(2500))
    };
    let mut polling = false;
    let options = WatchOptions {
        settle: Duration::from_millis(500),
        poll: Duration::from_millis(100),
        ..WatchOptions::default()
    };
    watch(&repo, &t.path("run"), &options, &stop, &mut |e| polling |= matches!(e, WatchEvent::Polling { .. })).unwrap();
    writers.join().unwrap();
    // Every version that holds these files holds them whole.
    let full_state = STATE.concat();
    let full_slow = SLOW.concat();
    let log = repo.log("HEAD").unwrap();
    assert!(!log.is_empty());
    for v in &log {
        for (p, b) in t.checkout_all(&repo, &v.id.to_hex()) {
            if p == "run/checkpoint-1500/trainer_state.json" {
                assert_eq!(String::from_utf8_lossy(&b), String::from_utf8_lossy(&full_state), "version {}", v.id);
            }
            // Without events only the settle time tells, and these pauses are longer.
            if p == "run/slow.json" && !polling {
                assert_eq!(String::from_utf8_lossy(&b), String::from_utf8_lossy(&full_slow), "version {}", v.id);
            }
        }
    }
    assert_eq!(in_head(&t, &repo, "run/checkpoint-1500/trainer_state.json").unwrap(), full_state);
    assert_eq!(in_head(&t, &repo, "run/slow.json").unwrap(), full_slow);
}

#[test]
fn skipped_links_special_files_and_unreadable_folders_are_reported_once() {
    use std::os::unix::fs::PermissionsExt;
    let t = TestRepo::init();
    let repo = t.open();
    std::fs::create_dir(t.path("c")).unwrap();
    t.write("c/real.pt", b"real");
    std::os::unix::fs::symlink("real.pt", t.path("c/last.pt")).unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(t.path("c/control.sock")).unwrap();
    t.write("c/checkpoint-1/model.bin", b"model");
    std::os::unix::fs::symlink("/etc/passwd", t.path("c/checkpoint-1/escape")).unwrap();
    t.write("c/checkpoint-1/private/x", b"x");
    std::fs::set_permissions(t.path("c/checkpoint-1/private"), std::fs::Permissions::from_mode(0o000)).unwrap();
    // As root (or with CAP_DAC_OVERRIDE) the folder stays readable.
    let unreadable = std::fs::read_dir(t.path("c/checkpoint-1/private")).is_err();
    let mut w = Watcher::new(&repo, &t.path("c"), options()).unwrap();
    let t0 = Instant::now();
    let e = w.step(t0).unwrap();
    let mut s = skipped(&e);
    s.sort();
    let paths: Vec<&str> = s.iter().map(|(p, _)| p.as_str()).collect();
    let mut expected = vec!["c/checkpoint-1/escape", "c/control.sock", "c/last.pt"];
    if unreadable {
        expected.insert(1, "c/checkpoint-1/private");
    }
    assert_eq!(paths, expected, "{e:?}");
    assert!(s.iter().any(|(p, r)| p == "c/last.pt" && r.contains("symbolic link")), "{s:?}");
    assert!(s.iter().any(|(p, r)| p == "c/control.sock" && r.contains("not a regular file")), "{s:?}");
    // Once, not at every scan; the rest is committed.
    let e = w.step(t0 + SETTLE).unwrap();
    assert!(skipped(&e).is_empty(), "reported again: {e:?}");
    assert_eq!(committed(&e), vec!["c/checkpoint-1", "c/real.pt"]);
    assert!(skipped(&w.step(t0 + 2 * SETTLE).unwrap()).is_empty());
    std::fs::set_permissions(t.path("c/checkpoint-1/private"), std::fs::Permissions::from_mode(0o755)).unwrap();
    // Gone and back: reported again.
    std::fs::remove_file(t.path("c/last.pt")).unwrap();
    assert!(skipped(&w.step(t0 + 3 * SETTLE).unwrap()).iter().all(|(p, _)| p != "c/last.pt"));
    std::os::unix::fs::symlink("real.pt", t.path("c/last.pt")).unwrap();
    assert_eq!(skipped(&w.step(t0 + 4 * SETTLE).unwrap()).len(), 1);
}

#[test]
fn the_cli_warns_once_per_skipped_path() {
    let t = TestRepo::init();
    std::fs::create_dir(t.path("out")).unwrap();
    t.write("out/step1.pt", b"weights");
    std::os::unix::fs::symlink("step1.pt", t.path("out/last.pt")).unwrap();
    let mut child = ckpt_command(t.root(), &["watch", "out", "--settle", "0.2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while t.open().log("HEAD").map(|l| l.len()).unwrap_or(0) < 1 {
        assert!(Instant::now() < deadline, "nothing committed");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Several more scans.
    std::thread::sleep(Duration::from_millis(1200));
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("last.pt")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(warnings[0].starts_with("warning: out/last.pt: skipped: a symbolic link"), "{err}");
}
