//! `watch`: checkpoints that appear slowly, are renamed into place, are deleted, are rewritten;
//! restarts do not commit twice (more in watch_trust.rs, which shares the helpers here). The library tests step the watcher with explicit times; the CLI
//! test runs `ckpt watch` itself (file-system events and polling) and restarts it.

use crate::support::repo_util::{ckpt_command, TestRepo};
use ckpt::watch::{WatchEvent, WatchOptions, Watcher, WATCH_LOG};
use std::time::{Duration, Instant};

pub(crate) const SETTLE: Duration = Duration::from_secs(5);

pub(crate) fn options() -> WatchOptions {
    WatchOptions { settle: SETTLE, ..WatchOptions::default() }
}

pub(crate) fn committed(events: &[WatchEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            WatchEvent::Committed { path, .. } => Some(path.clone()),
            _ => None,
        })
        .collect()
}

fn versions(t: &TestRepo) -> usize {
    t.open().log("HEAD").map(|l| l.len()).unwrap_or(0)
}

#[test]
fn a_file_is_committed_once_it_stops_growing_and_only_once() {
    let t = TestRepo::init();
    let repo = t.open();
    std::fs::create_dir(t.path("ckpts")).unwrap();
    let mut w = Watcher::new(&repo, &t.path("ckpts"), options()).unwrap();
    let t0 = Instant::now();
    t.write("ckpts/epoch1.pt", b"first half ");
    assert!(committed(&w.step(t0).unwrap()).is_empty());
    // Still being written: it grows before the settle time is over.
    let mut all = b"first half ".to_vec();
    all.extend(b"second half");
    t.write("ckpts/epoch1.pt", &all);
    assert!(committed(&w.step(t0 + SETTLE - Duration::from_secs(1)).unwrap()).is_empty());
    // Unchanged since the last scan, but not for the settle time yet.
    assert!(committed(&w.step(t0 + SETTLE + Duration::from_secs(1)).unwrap()).is_empty());
    let e = w.step(t0 + 2 * SETTLE).unwrap();
    assert_eq!(committed(&e), vec!["ckpts/epoch1.pt"]);
    assert!(committed(&w.step(t0 + 4 * SETTLE).unwrap()).is_empty(), "committed twice");
    drop(w);
    let out = t.checkout_all(&repo, "HEAD");
    assert_eq!(out, vec![("ckpts/epoch1.pt".to_string(), all)]);
}

#[test]
fn renamed_files_and_finished_trainer_folders_are_committed_deleted_ones_forgotten() {
    let t = TestRepo::init();
    let repo = t.open();
    std::fs::create_dir(t.path("run")).unwrap();
    let mut w = Watcher::new(&repo, &t.path("run"), options()).unwrap();
    let t0 = Instant::now();
    // Written under a temporary name (ignored), then renamed into place.
    t.write("run/model.pt.tmp", b"weights");
    assert!(w.step(t0).unwrap().is_empty());
    assert!(w.step(t0 + 2 * SETTLE).unwrap().is_empty(), "a .tmp file was committed");
    std::fs::rename(t.path("run/model.pt.tmp"), t.path("run/model.pt")).unwrap();
    assert!(committed(&w.step(t0 + 2 * SETTLE).unwrap()).is_empty());
    assert_eq!(committed(&w.step(t0 + 4 * SETTLE).unwrap()), vec!["run/model.pt"]);

    // A Trainer folder: committed once settled, trainer_state.json or not (watch_trust.rs).
    t.write("run/checkpoint-10/model.safetensors", &crate::support::util::all_dtypes_file(1));
    t.write("run/checkpoint-10/optimizer.pt", b"state");
    let e = w.step(t0 + 4 * SETTLE).unwrap();
    assert!(committed(&e).is_empty(), "an unfinished folder was committed");
    t.write("run/checkpoint-10/trainer_state.json", b"{}");
    let e = w.step(t0 + 4 * SETTLE).unwrap();
    assert!(committed(&e).is_empty(), "an unsettled folder was committed");
    let e = w.step(t0 + 5 * SETTLE).unwrap();
    assert_eq!(committed(&e), vec!["run/checkpoint-10"]);
    assert!(matches!(e[0], WatchEvent::Committed { files: 3, .. }));

    // Deleted (a trainer's save_total_limit): nothing fails, nothing is lost.
    std::fs::remove_dir_all(t.path("run/checkpoint-10")).unwrap();
    assert!(w.step(t0 + 6 * SETTLE).unwrap().is_empty());
    drop(w);
    let out = t.checkout_all(&repo, "HEAD");
    assert!(out.iter().any(|(p, b)| p == "run/checkpoint-10/optimizer.pt" && b == b"state"));
    assert_eq!(repo.log("HEAD").unwrap().len(), 2);
}

#[test]
fn a_restarted_watcher_does_not_commit_again_but_commits_rewrites() {
    let t = TestRepo::init();
    std::fs::create_dir(t.path("c")).unwrap();
    t.write("c/a.pt", b"a");
    t.write("c/b.pt", b"b");
    let t0 = Instant::now();
    {
        let repo = t.open();
        let mut w = Watcher::new(&repo, &t.path("c"), options()).unwrap();
        w.step(t0).unwrap();
        assert_eq!(committed(&w.step(t0 + SETTLE).unwrap()), vec!["c/a.pt", "c/b.pt"]);
    }
    assert_eq!(versions(&t), 2);
    // Restarted: the log says both were committed.
    {
        let repo = t.open();
        let mut w = Watcher::new(&repo, &t.path("c"), options()).unwrap();
        w.step(t0).unwrap();
        let e = w.step(t0 + SETTLE).unwrap();
        assert!(committed(&e).is_empty(), "{e:?}");
        assert_eq!(e.len(), 2);
    }
    // Without the log (a crash right after a commit), HEAD still says so.
    std::fs::remove_file(t.path(".ckpt").join(WATCH_LOG)).unwrap();
    {
        let repo = t.open();
        let mut w = Watcher::new(&repo, &t.path("c"), options()).unwrap();
        w.step(t0).unwrap();
        assert!(committed(&w.step(t0 + SETTLE).unwrap()).is_empty());
        // A rewritten checkpoint (last.ckpt style) is a new version.
        t.write("c/a.pt", b"a, later");
        w.step(t0 + SETTLE).unwrap();
        assert_eq!(committed(&w.step(t0 + 3 * SETTLE).unwrap()), vec!["c/a.pt"]);
    }
    assert_eq!(versions(&t), 3);
}

#[test]
fn a_checkpoint_that_cannot_be_committed_is_reported_and_the_others_go_on() {
    let t = TestRepo::init();
    let repo = t.open();
    std::fs::create_dir(t.path("w")).unwrap();
    t.write("w/bad.safetensors", b"not a safetensors file");
    t.write("w/good.pt", b"good");
    let mut w = Watcher::new(&repo, &t.path("w"), options()).unwrap();
    let t0 = Instant::now();
    w.step(t0).unwrap();
    let e = w.step(t0 + SETTLE).unwrap();
    assert!(
        matches!(&e[0], WatchEvent::Failed { path, reason } if path == "w/bad.safetensors" && reason.contains("safetensors")),
        "{e:?}"
    );
    assert_eq!(committed(&e), vec!["w/good.pt"]);
}

#[test]
fn the_cli_commits_while_running_and_after_a_restart_commits_nothing_twice() {
    let t = TestRepo::init();
    std::fs::create_dir(t.path("out")).unwrap();
    let spawn = || {
        ckpt_command(t.root(), &["watch", "out", "--settle", "0.3"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let wait_for = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while versions(&t) < n {
            assert!(Instant::now() < deadline, "ckpt watch committed {} of {n} versions", versions(&t));
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let mut child = spawn();
    t.write("out/step1.pt", &crate::support::util::noise(1, 10_000));
    wait_for(1);
    t.write("out/step2.pt.part", &crate::support::util::noise(2, 10_000));
    std::fs::rename(t.path("out/step2.pt.part"), t.path("out/step2.pt")).unwrap();
    wait_for(2);
    child.kill().unwrap();
    child.wait().unwrap();

    let mut child = spawn();
    std::thread::sleep(Duration::from_millis(1500));
    t.write("out/step3.pt", &crate::support::util::noise(3, 10_000));
    wait_for(3);
    std::thread::sleep(Duration::from_millis(1000));
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(versions(&t), 3, "a restart committed a checkpoint again");
}
