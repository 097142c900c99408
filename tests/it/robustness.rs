//! Robustness (issue 18, items 2-4): history the reader accepts whatever the config, inputs that
//! change or block under a commit, huge `-j`, verify beside writers, compaction that fails, and
//! a stale waiter marker.

use crate::support::repo_util::{ckpt_in, output_within, stderr, TestRepo};
use crate::support::tmpfs::Tmpfs;
use crate::support::util::safetensors_file;
use ckpt::repo::{CommitOptions, Compaction, Config, DeltaPolicy, Repo, MAX_BASE_EVERY};
use ckpt::Dtype;
use std::path::Path;
use std::time::{Duration, Instant};

/// A temporary directory on tmpfs when the machine has one (`/dev/shm`): tests that write
/// thousands of objects then pay no fsync (each costs milliseconds on a disk).
fn fast_tempdir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::tempdir().unwrap()
}

/// A safetensors file of one 8 KiB u8 tensor of noise with `version` written into its first
/// bytes: incompressible, so its standalone blob takes three 4 KiB blocks, while the delta
/// between two versions is a few bytes and frees blocks (the condition for a reverse rewrite).
fn tiny_checkpoint(version: u32) -> Vec<u8> {
    let mut file = safetensors_file(7, &[("w", Dtype::U8, &[8192])]);
    let at = file.len() - 8192;
    file[at..at + 4].copy_from_slice(&version.to_le_bytes());
    file
}

#[test]
fn config_over_the_reader_limit_is_refused_naming_the_file() {
    let t = TestRepo::init();
    let config = Config { base_every: MAX_BASE_EVERY + 1, ..Config::default() };
    std::fs::write(t.path(".ckpt/config"), serde_json::to_vec(&config).unwrap()).unwrap();
    let err = Repo::open(t.root()).unwrap_err().to_string();
    assert!(err.contains(".ckpt/config") && err.contains("base_every 1001"), "{err}");
    let out = ckpt_in(t.root(), &["log"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("base_every 1001 is over 1000"), "{}", stderr(&out));
}

/// The longest history the config allows: `base_every` at its maximum, reverse deltas rewritten
/// inline, so the root version's blob ends at the bottom of a chain `MAX_BASE_EVERY` deltas
/// deep (root, then versions 1 ..= MAX_BASE_EVERY - 1, then the kept base at MAX_BASE_EVERY).
/// Every version must check out bit-exactly, the oldest through the whole chain.
#[test]
fn the_longest_history_the_config_allows_reads_back() {
    let dir = fast_tempdir();
    Repo::init(dir.path()).unwrap();
    let config = Config {
        base_every: MAX_BASE_EVERY,
        delta_policy: DeltaPolicy::Reverse,
        compact: Compaction::Inline,
        ..Config::default()
    };
    std::fs::write(dir.path().join(".ckpt/config"), config.to_json()).unwrap();
    let repo = Repo::open(dir.path()).unwrap();
    let file = dir.path().join("m.safetensors");
    let start = Instant::now();
    let mut ids = Vec::new();
    // One more than base_every: the last one makes version MAX_BASE_EVERY's blobs a kept base
    // and checks that the chain stops there.
    for v in 0..=MAX_BASE_EVERY + 1 {
        std::fs::write(&file, tiny_checkpoint(v)).unwrap();
        // A caller's override cannot go past the limit either: it is clamped like the config.
        let options = CommitOptions { base_every: Some(u32::MAX), ..CommitOptions::default() };
        ids.push(repo.commit(&[&file], &format!("v{v}"), &options).unwrap());
    }
    eprintln!("{} commits in {:?}", ids.len(), start.elapsed());
    let manifest = repo.manifest(&repo.version(&ids[0]).unwrap().files[0].manifest).unwrap();
    // The tensor's blob, or its bundle's (small tensors are bundled): the deepest of the file's.
    let deepest = manifest.blobs().map(|b| repo.store().chain_depth(&b).unwrap()).max().unwrap();
    assert_eq!(deepest, MAX_BASE_EVERY, "the deepest chain allowed");
    for v in [0, 1, MAX_BASE_EVERY - 1, MAX_BASE_EVERY, MAX_BASE_EVERY + 1] {
        let out = dir.path().join(format!("out{v}"));
        repo.checkout(&ids[v as usize].to_string(), None, Some(&out), None).unwrap();
        assert!(std::fs::read(out.join("m.safetensors")).unwrap() == tiny_checkpoint(v), "version {v}");
    }
    let report = repo.verify().unwrap();
    assert!(report.is_ok(), "verify: {report:?}");
}

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success());
}

/// A named pipe (which nobody writes) given to `commit`, `compress`, `stats` or `status` is
/// refused at once: before, `open` waited for a writer forever, `commit` with the writer lock
/// held.
#[test]
fn a_named_pipe_is_refused_without_blocking() {
    let t = TestRepo::init();
    t.write("m.safetensors", &tiny_checkpoint(0));
    assert!(t.ckpt(&["commit", "-m", "v0", "m.safetensors"]).status.success());
    mkfifo(&t.path("pipe"));
    for args in [&["commit", "-m", "pipe", "pipe"][..], &["compress", "pipe"], &["stats", "pipe"]] {
        let out = output_within(crate::support::repo_util::ckpt_command(t.root(), args), Duration::from_secs(10))
            .unwrap_or_else(|| panic!("ckpt {args:?} blocked on a named pipe"));
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr(&out).contains("named pipe"), "{args:?}: {}", stderr(&out));
    }
    // A tracked file replaced by a pipe: status says it is modified (its size differs) or fails
    // clearly, without blocking.
    std::fs::remove_file(t.path("m.safetensors")).unwrap();
    mkfifo(&t.path("m.safetensors"));
    let out = output_within(crate::support::repo_util::ckpt_command(t.root(), &["status"]), Duration::from_secs(10))
        .expect("status blocked on a named pipe");
    assert!(String::from_utf8_lossy(&out.stdout).contains("modified") || stderr(&out).contains("named pipe"));
    // The writer lock was not left held: a commit goes through.
    std::fs::remove_file(t.path("m.safetensors")).unwrap();
    t.write("m.safetensors", &tiny_checkpoint(1));
    let out = t.ckpt(&["commit", "-m", "v1", "m.safetensors"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// `-j` far beyond the cores is capped with a note instead of a panic.
#[test]
fn a_huge_thread_count_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("m.safetensors"), tiny_checkpoint(0)).unwrap();
    let out = ckpt_in(dir.path(), &["-j", "100000000", "compress", "m.safetensors"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("-j 100000000 is more than"), "{}", stderr(&out));
    assert!(dir.path().join("m.safetensors.ckz").is_file());
}

/// Rewrites `path` in place the way a training loop does: `open(O_TRUNC)`, then the new content
/// in pieces, `pause` after each.
fn rewrite_in_place(path: &Path, content: &[u8], pause: Duration) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    for piece in content.chunks(content.len().div_ceil(8)) {
        std::thread::sleep(pause);
        f.write_all(piece).unwrap();
    }
}

/// A checkpoint rewritten in place (truncated, then written again) over and over while `ckpt
/// commit` reads it: the commit fails with "changed while being committed" (or, opened
/// half-written, as an invalid file), never dies of SIGBUS; nothing it half-did moves a ref, and
/// a retry once the file is complete commits exactly its content. The store verifies after.
#[test]
fn a_checkpoint_truncated_during_a_commit_fails_the_commit_cleanly() {
    use std::os::unix::process::ExitStatusExt;
    let t = TestRepo::init();
    let shapes: Vec<(String, Dtype, Vec<u64>)> =
        (0..4).map(|i| (format!("l{i}"), Dtype::F32, vec![1024, 1024])).collect();
    let spec: Vec<(&str, Dtype, &[u64])> = shapes.iter().map(|(n, d, s)| (n.as_str(), *d, s.as_slice())).collect();
    let path = t.path("m.safetensors");
    std::fs::write(&path, safetensors_file(0, &spec)).unwrap();
    assert!(t.ckpt(&["commit", "-m", "v0", "m.safetensors"]).status.success());
    // Made beforehand: the rewrites follow each other without a pause.
    let contents: Vec<Vec<u8>> = (1..=3).map(|seed| safetensors_file(seed, &spec)).collect();
    let head = || std::fs::read_to_string(t.path(".ckpt/refs/heads/main")).unwrap();
    let (mut changed, mut succeeded, mut invalid) = (0, 0, 0);
    for trial in 1..=20u64 {
        let before = head();
        let mut command =
            crate::support::repo_util::ckpt_command(t.root(), &["commit", "-m", "racing", "m.safetensors"]);
        command.env("CKPT_COMPACT", "manual").stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        let mut child = command.spawn().unwrap();
        // The training loop: rewrites the file until the commit is over.
        let mut n = trial as usize;
        // The file is complete at first (the last retry committed it): the commit opens a whole
        // file, which is truncated under it somewhere while it reads.
        std::thread::sleep(Duration::from_millis(2 * (trial % 10)));
        while child.try_wait().unwrap().is_none() {
            n += 1;
            rewrite_in_place(&path, &contents[n % contents.len()], Duration::from_millis(1));
        }
        // What the file holds now: the last rewrite's content, or, when the commit was over
        // before the first rewrite, what the previous trial left.
        let content = std::fs::read(&path).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.signal(), None, "trial {trial}: killed by a signal; {}", stderr(&out));
        if out.status.success() {
            succeeded += 1;
        } else {
            if stderr(&out).contains("changed while it was being committed") {
                changed += 1;
            } else {
                // Opened between the truncation and the end of a rewrite: the file was not a
                // checkpoint at that moment, which is what the commit says.
                assert!(stderr(&out).contains("invalid safetensors file"), "trial {trial}: {}", stderr(&out));
                invalid += 1;
            }
            assert_eq!(head(), before, "trial {trial}: a failed commit moved the branch");
        }
        // The retry, with the file complete, commits exactly its content.
        let out = t.ckpt(&["commit", "-m", "retry", "m.safetensors"]);
        assert!(out.status.success(), "trial {trial}: {}", stderr(&out));
        let repo = t.open();
        assert!(t.checkout_all(&repo, "HEAD") == vec![("m.safetensors".to_string(), content)], "trial {trial}");
    }
    eprintln!("{changed} commits saw the file change, {invalid} opened it half-written, {succeeded} did not");
    assert!(changed > 0, "no commit saw the file change");
    let out = t.ckpt(&["verify"]);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
}

/// `verify` run again and again beside a writer that commits (reverse deltas rewritten inline,
/// so blobs are renamed over), leaves unreferenced objects (as an interrupted commit does) and
/// runs gc: a healthy repository is never reported damaged.
#[test]
fn verify_beside_commits_and_gc_raises_no_false_alarm() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = fast_tempdir();
    Repo::init(dir.path()).unwrap();
    let config = Config { compact: Compaction::Inline, ..Config::default() };
    std::fs::write(dir.path().join(".ckpt/config"), config.to_json()).unwrap();
    let file = dir.path().join("m.safetensors");
    std::fs::write(&file, tiny_checkpoint(0)).unwrap();
    Repo::open(dir.path()).unwrap().commit(&[&file], "v0", &CommitOptions::default()).unwrap();
    let done = AtomicBool::new(false);
    let writes = std::sync::atomic::AtomicU32::new(0);
    let verified = std::sync::atomic::AtomicU32::new(0);
    let (runs, alarms, writes) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let repo = Repo::open(dir.path()).unwrap();
            let mut n = 0u32;
            // Paced by the verifier (at most two commits per verify run), so that the history,
            // which every verify re-hashes, stays small however slow a loaded machine makes
            // verify: the test counts runs and commits, not seconds.
            while !done.load(Ordering::Relaxed) && n < 400 {
                std::thread::sleep(Duration::from_millis(20));
                if n >= 2 * verified.load(Ordering::Relaxed) + 2 {
                    continue;
                }
                n += 1;
                writes.store(n, Ordering::Relaxed);
                // Garbage for gc: a (valid) blob nothing refers to, as an interrupted commit
                // leaves.
                let junk = format!("junk {n}").into_bytes();
                let id = ckpt::ObjectId::hash(&junk);
                repo.store().write_blob(id, &junk, None, &Default::default(), &ckpt::store::Feedback::NONE).unwrap();
                std::fs::write(&file, tiny_checkpoint(n)).unwrap();
                repo.commit(&[&file], &format!("v{n}"), &CommitOptions::default()).unwrap();
                if n.is_multiple_of(2) {
                    repo.gc_with(&ckpt::repo::GcOptions::now()).unwrap();
                }
            }
            n
        });
        let repo = Repo::open(dir.path()).unwrap();
        let start = Instant::now();
        let (mut runs, mut alarms) = (0u32, Vec::new());
        while runs < 50 || start.elapsed() < Duration::from_secs(2) || writes.load(Ordering::Relaxed) < 40 {
            let report = repo.verify().unwrap();
            if !report.is_ok() {
                alarms.push(report);
            }
            runs += 1;
            verified.store(runs, Ordering::Relaxed);
            // Only a guard against a hang: the counts above end the loop.
            if start.elapsed() > Duration::from_secs(300) {
                break;
            }
        }
        done.store(true, Ordering::Relaxed);
        (runs, alarms, writer.join().unwrap())
    });
    eprintln!("{runs} verify runs beside {writes} commits");
    assert!(runs >= 50, "only {runs} runs");
    assert!(alarms.is_empty(), "{} false alarms, the first: {:?}", alarms.len(), alarms.first());
    assert!(writes >= 40, "the writer hardly ran ({writes} commits)");
}

/// Two versions of a 1 MiB tensor of noise, with every other 4 KiB block of the second
/// replaced: the delta between them is about half the size of either, so a reverse rewrite
/// pays, but needs half a MiB of free space.
fn half_changed_checkpoint(version: u64) -> Vec<u8> {
    let mut file = safetensors_file(1, &[("w", Dtype::U8, &[1 << 20])]);
    let data = file.len() - (1 << 20);
    let other = crate::support::util::noise(100 + version, 1 << 20);
    for block in (0..256).filter(|b| version > 0 && b % 2 == 0) {
        let r = block * 4096..(block + 1) * 4096;
        file[data + r.start..data + r.end].copy_from_slice(&other[r]);
    }
    file
}

/// Compaction on a full file system: `ckpt compact` fails (non-zero exit naming the cause), the
/// failure is in `.ckpt/compact.log` and `ckpt status`, the version stays pending; with space
/// again, the next compaction does it. An inline compaction that fails keeps the commit.
#[test]
fn a_compaction_that_fails_on_a_full_disk_is_reported_and_retried() {
    let Some(fs) = Tmpfs::mount("8m") else { return };
    let root = fs.path().join("repo");
    std::fs::create_dir(&root).unwrap();
    let run = |args: &[&str], compact: &str| {
        let mut c = crate::support::repo_util::ckpt_command(&root, args);
        c.env("CKPT_COMPACT", compact);
        c.output().unwrap()
    };
    assert!(run(&["init"], "manual").status.success());
    for v in 0..2 {
        std::fs::write(root.join("m.safetensors"), half_changed_checkpoint(v)).unwrap();
        let out = run(&["commit", "-m", &format!("v{v}"), "m.safetensors"], "manual");
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let filler = fs.path().join("filler");
    fs.fill(&filler, 128 << 10);
    let out = run(&["compact"], "manual");
    assert!(!out.status.success(), "compact reported success on a full disk");
    assert!(stderr(&out).contains("No space left") && stderr(&out).contains("stays pending"), "{}", stderr(&out));
    let log = std::fs::read_to_string(root.join(".ckpt/compact.log")).unwrap();
    assert!(log.contains("No space left"), "{log}");
    let status = String::from_utf8_lossy(&run(&["status"], "manual").stdout).into_owned();
    assert!(
        status.contains("1 version still to be turned into deltas") && status.contains("No space left"),
        "{status}"
    );

    // Space again: the next compaction retries it, and the record goes.
    std::fs::remove_file(&filler).unwrap();
    let out = run(&["compact"], "manual");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 version compacted: 1 blob"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let status = String::from_utf8_lossy(&run(&["status"], "manual").stdout).into_owned();
    assert!(!status.contains("still to be turned") && !status.contains("compaction reported"), "{status}");

    // Inline: room for the new version's blob, not for the rewrite of its parent's.
    std::fs::write(root.join("m.safetensors"), half_changed_checkpoint(2)).unwrap();
    fs.fill(&filler, (1 << 20) + (200 << 10));
    let out = run(&["commit", "-m", "v2", "m.safetensors"], "inline");
    assert!(out.status.success(), "the commit itself must stand: {}", stderr(&out));
    assert!(stderr(&out).contains("stays pending") && stderr(&out).contains("No space left"), "{}", stderr(&out));
    let status = String::from_utf8_lossy(&run(&["status"], "manual").stdout).into_owned();
    assert!(status.contains("1 version still to be turned into deltas"), "{status}");
    std::fs::remove_file(&filler).unwrap();
    let out = run(&["compact"], "manual");
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 version compacted: 1 blob"));
    let out = run(&["verify"], "manual");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    for (v, rev) in [(0, "HEAD~2"), (1, "HEAD~1"), (2, "HEAD")] {
        let out_dir = fs.path().join(format!("out{v}"));
        let out = run(&["checkout", rev, "--output", out_dir.to_str().unwrap()], "manual");
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(std::fs::read(out_dir.join("m.safetensors")).unwrap() == half_changed_checkpoint(v), "v{v}");
        std::fs::remove_dir_all(&out_dir).unwrap();
    }
}

/// `.ckpt/lock.waiting` left by a waiter that is gone (killed while it waited) no longer stops
/// background compaction for good: the marker is ignored and removed.
#[test]
fn a_stale_waiter_marker_is_ignored_and_cleaned_up() {
    use std::os::unix::process::CommandExt;
    let t = TestRepo::init();
    let run = |args: &[&str]| {
        let mut c = crate::support::repo_util::ckpt_command(t.root(), args);
        c.env("CKPT_COMPACT", "manual");
        c.output().unwrap()
    };
    for v in 0..2 {
        t.write("m.safetensors", &half_changed_checkpoint(v));
        assert!(run(&["commit", "-m", &format!("v{v}"), "m.safetensors"]).status.success());
    }
    // A real waiter, killed while it waits: the lock is held here (as another writer would).
    let lock = std::fs::File::options().write(true).open(t.path(".ckpt/lock")).unwrap();
    lock.lock().unwrap();
    let mut waiter = crate::support::repo_util::ckpt_command(t.root(), &["commit", "-m", "waits", "m.safetensors"]);
    waiter.env("CKPT_LOCK_TIMEOUT", "60").process_group(0);
    let mut child = waiter.spawn().unwrap();
    let marker = t.path(".ckpt/lock.waiting");
    let start = Instant::now();
    while !marker.exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "the waiter never showed");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(50));
    child.kill().unwrap();
    child.wait().unwrap();
    lock.unlock().unwrap();
    assert!(marker.exists(), "a killed waiter leaves its marker");
    // The background compaction (which steps aside for waiting writers) does its work.
    let out = run(&["compact", "--background"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let status = String::from_utf8_lossy(&run(&["status"]).stdout).into_owned();
    assert!(!status.contains("still to be turned"), "the stale marker stopped the compaction: {status}");
    assert!(!marker.exists(), "the stale marker is removed");
}

/// `compress` and `status` reading a file that is rewritten in place meanwhile: never a SIGBUS;
/// `compress` either succeeds or fails saying the file changed (leaving no output), and
/// `status` either answers or says the same.
#[test]
fn compress_and_status_of_a_file_truncated_under_them_fail_cleanly() {
    use std::os::unix::process::ExitStatusExt;
    let t = TestRepo::init();
    let spec = [("a", Dtype::F32, &[1024u64, 1024][..]), ("b", Dtype::F32, &[1024, 1024][..])];
    let contents: Vec<Vec<u8>> = (1..=2).map(|seed| safetensors_file(seed, &spec)).collect();
    let path = t.path("m.safetensors");
    std::fs::write(&path, &contents[0]).unwrap();
    assert!(t.ckpt(&["commit", "-m", "v0", "m.safetensors"]).status.success());
    let mut changed = 0;
    for trial in 0..16u64 {
        let args: &[&str] = if trial % 2 == 0 { &["compress", "m.safetensors", "-o", "m.ckz"] } else { &["status"] };
        let mut command = crate::support::repo_util::ckpt_command(t.root(), args);
        command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        let mut child = command.spawn().unwrap();
        std::thread::sleep(Duration::from_millis(trial % 8));
        let mut n = 0;
        while child.try_wait().unwrap().is_none() {
            n += 1;
            rewrite_in_place(&path, &contents[n % 2], Duration::from_millis(1));
        }
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.signal(), None, "{args:?}: killed by a signal; {}", stderr(&out));
        if !out.status.success() {
            // Or, opened half-written, an invalid file at that moment.
            let e = stderr(&out);
            assert!(
                e.contains("changed while it was being read") || e.contains("invalid safetensors"),
                "{args:?}: {e}"
            );
            changed += e.contains("changed while") as usize;
            if trial % 2 == 0 {
                assert!(!t.path("m.ckz").exists(), "a failed compress leaves no output");
            }
        }
        let _ = std::fs::remove_file(t.path("m.ckz"));
    }
    eprintln!("{changed} of 16 runs saw the file change");
}
