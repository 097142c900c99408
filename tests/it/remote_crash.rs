//! kill -9 of `ckpt push`, `ckpt fetch` and `ckpt clone` at random moments, against a directory
//! remote and a real S3-protocol server (`s3s-fs`; skipped with a message when it is not
//! installed), in the mirror layout (the default) with a history long enough that pushes recode
//! the remote's older blobs. After every killed push a rerun completes, a reader fetching all
//! the while never fails (a remote ref always names a version it can read), and at the end a
//! fresh clone verifies and checks out every version bit-exactly. After every killed fetch or
//! clone the local store verifies, and a rerun completes with every version bit-exact.
//! Abandoned journals: a later push removes them after the grace period, never one a push in
//! flight may still finish. A smudge's download (`fetch_file`) does not block a commit of the
//! same store. `CKPT_CRASH_TRIALS=N` runs N trials of each kind instead of the default.

use crate::support::layout::remote_objects;
use crate::support::remote::{directory, s3, Served};
use crate::support::repo_util::{ckpt_command, stderr, synthetic_checkpoint, Rng, TRAINING_MODEL};
use ckpt::remote::local::DirRemote;
use ckpt::remote::{self, Expect, Remote, Small, UploadMode, Uploaded};
use ckpt::repo::{Config, Repo, VersionId};
use ckpt::sync::PushOptions;
use ckpt::Dtype;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

fn model(epoch: u32) -> Vec<u8> {
    synthetic_checkpoint(31, Dtype::Bf16, TRAINING_MODEL, epoch)
}

fn trials(default: u32) -> u32 {
    std::env::var("CKPT_CRASH_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Starts `ckpt args` in `dir` with the remote's environment, kills it with SIGKILL after
/// `delay`, and returns whether it had finished (successfully) by then.
fn kill_after(r: &Served, dir: &Path, args: &[&str], delay: Duration) -> bool {
    let mut c = ckpt_command(dir, args);
    for (k, v) in &r.env {
        c.env(k, v);
    }
    let mut child = c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn ckpt");
    std::thread::sleep(delay);
    let _ = child.kill();
    child.wait().unwrap().success()
}

fn timed(r: &Served, dir: &Path, args: &[&str]) -> Duration {
    let start = Instant::now();
    r.ok(dir, args);
    start.elapsed()
}

/// The version the repository at `dir` has at `rev`.
fn resolve(dir: &Path, rev: &str) -> VersionId {
    Repo::open(dir).unwrap().resolve(rev).unwrap()
}

/// Verifies the repository at `dir` and checks out every version of `history` from it,
/// bit-exactly (through the library: a process per check would make the test slow).
fn check_history(dir: &Path, history: &[(VersionId, Vec<u8>)], what: &str) {
    let repo = Repo::open(dir).unwrap_or_else(|e| panic!("{what}: the repository does not open: {e}"));
    let report = repo.verify().unwrap();
    assert!(report.is_ok(), "{what}: verify failed: {report:?}");
    for (id, bytes) in history {
        let out = tempfile::tempdir().unwrap();
        repo.checkout(&id.to_hex(), None, Some(out.path()), None)
            .unwrap_or_else(|e| panic!("{what}: checkout {id}: {e}"));
        assert!(std::fs::read(out.path().join("model.safetensors")).unwrap() == *bytes, "{what}: {id} differs");
    }
}

/// Verifies the repository at `dir` (what a killed fetch or clone left).
fn check_store(dir: &Path, what: &str) {
    let repo = Repo::open(dir).unwrap_or_else(|e| panic!("{what}: the repository does not open: {e}"));
    let report = repo.verify().unwrap();
    assert!(report.is_ok(), "{what}: verify failed: {report:?}");
}

fn journals(r: &Served) -> usize {
    std::fs::read_dir(r.objects.parent().unwrap().join("pending")).map_or(0, |d| d.count())
}

/// Pushes killed at random points, with a reader fetching throughout.
fn kill_pushes(r: &Served, seed: u64) {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    r.ok(dir, &["init"]);
    r.ok(dir, &["remote", "add", "origin", &r.url]);
    let mut history = Vec::new();
    let mut epoch = 0;
    let mut commit = |history: &mut Vec<(VersionId, Vec<u8>)>| {
        let bytes = model(epoch);
        std::fs::write(dir.join("model.safetensors"), &bytes).unwrap();
        r.ok(dir, &["commit", "-m", &format!("epoch {epoch}"), "model.safetensors"]);
        history.push((resolve(dir, "HEAD"), bytes));
        epoch += 1;
    };
    commit(&mut history);
    commit(&mut history);
    let mut push_time = timed(r, dir, &["push"]);
    commit(&mut history);
    push_time = push_time.max(timed(r, dir, &["push"]));

    let readers = tempfile::tempdir().unwrap();
    let reader = readers.path().join("reader");
    r.ok(readers.path(), &["clone", &r.url, reader.to_str().unwrap()]);
    let stop = AtomicBool::new(false);
    let fetches = AtomicU32::new(0);
    let mut rng = Rng::new(seed);
    let mut finished = 0;
    std::thread::scope(|scope| {
        let reading = scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let o = r.ckpt(&reader, &["fetch", "origin"]);
                assert!(o.status.success(), "a fetch during the pushes failed: {}", stderr(&o));
                fetches.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        for trial in 0..trials(5) {
            commit(&mut history);
            if trial % 3 == 2 {
                // Two versions in one push.
                commit(&mut history);
            }
            let delay = push_time.mul_f64(rng.unit() * 1.2);
            finished += kill_after(r, dir, &["push"], delay) as u32;
            if trial % 4 == 1 {
                // Another version on top before the rerun: the killed push's journal is then
                // one of an older version.
                commit(&mut history);
                let delay = push_time.mul_f64(rng.unit() * 1.2);
                finished += kill_after(r, dir, &["push"], delay) as u32;
            }
            r.ok(dir, &["push"]);
            let remote_tip = std::fs::read_to_string(r.objects.parent().unwrap().join("refs/heads/main")).unwrap();
            assert_eq!(remote_tip.trim(), history.last().unwrap().0.to_hex(), "trial {trial}: the rerun pushed");
        }
        stop.store(true, Ordering::Relaxed);
        if let Err(panic) = reading.join() {
            std::panic::resume_unwind(panic);
        }
    });
    // One more push finishes the journals of versions below the tip.
    r.ok(dir, &["push"]);
    assert_eq!(journals(r), 0, "no journal is left");
    let objects = remote_objects(&r.objects);
    assert!(objects.values().any(|o| o.header.reference.is_some()), "pushes recoded older blobs");

    let out = tempfile::tempdir().unwrap();
    let clone = out.path().join("clone");
    r.ok(out.path(), &["clone", &r.url, clone.to_str().unwrap()]);
    check_history(&clone, &history, "fresh clone");
    // The reader, which fetched while pushes were killed, holds everything too.
    r.ok(&reader, &["fetch", "origin"]);
    check_history(&reader, &history, "reader");
    // Uploads a kill cut short stay in a directory remote's tmp/ (nothing deletes them yet).
    let leftovers = std::fs::read_dir(r.objects.parent().unwrap().join("tmp")).map_or(0, |d| d.count());
    eprintln!(
        "{} versions; {finished} pushes finished before the kill; {} fetches alongside; {leftovers} files left in tmp/",
        history.len(),
        fetches.load(Ordering::Relaxed)
    );
}

#[test]
fn kill_9_during_push_to_a_directory_remote() {
    let Some(r) = directory() else { return };
    kill_pushes(&r, 7);
}

#[test]
fn kill_9_during_push_to_s3() {
    let Some(r) = s3() else { return };
    kill_pushes(&r, 8);
}

/// Fetches and clones killed at random points, from a remote with a mirror history.
fn kill_fetches(r: &Served, seed: u64) {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();
    r.ok(dir, &["init"]);
    r.ok(dir, &["remote", "add", "origin", &r.url]);
    let mut history = Vec::new();
    for epoch in 0..4 {
        let bytes = model(epoch);
        std::fs::write(dir.join("model.safetensors"), &bytes).unwrap();
        r.ok(dir, &["commit", "-m", &format!("epoch {epoch}"), "model.safetensors"]);
        history.push((resolve(dir, "HEAD"), bytes));
        r.ok(dir, &["push"]);
    }
    assert!(remote_objects(&r.objects).values().any(|o| o.header.reference.is_some()), "recoded");
    let scratch = tempfile::tempdir().unwrap();
    let first = scratch.path().join("first");
    let clone_time = timed(r, scratch.path(), &["clone", &r.url, first.to_str().unwrap()]);
    std::fs::remove_dir_all(&first).unwrap();
    let mut rng = Rng::new(seed);
    let mut finished = 0;
    for trial in 0..trials(2) {
        // A fetch into an empty repository, killed, then checked and rerun.
        let fetcher = scratch.path().join(format!("fetch{trial}"));
        std::fs::create_dir(&fetcher).unwrap();
        r.ok(&fetcher, &["init"]);
        r.ok(&fetcher, &["remote", "add", "origin", &r.url]);
        for _ in 0..2 {
            let delay = clone_time.mul_f64(rng.unit() * 1.2);
            finished += kill_after(r, &fetcher, &["fetch", "origin"], delay) as u32;
            check_store(&fetcher, &format!("fetch trial {trial}, killed after {delay:?}"));
        }
        r.ok(&fetcher, &["fetch", "origin"]);
        assert_eq!(resolve(&fetcher, "origin/main"), history.last().unwrap().0, "fetch trial {trial}");
        check_history(&fetcher, &history, &format!("fetch trial {trial}"));
        std::fs::remove_dir_all(&fetcher).unwrap();

        // A clone, killed: what it left is a valid repository or nothing usable; a fetch
        // there works, and so does a new clone.
        let cloned = scratch.path().join(format!("clone{trial}"));
        let delay = clone_time.mul_f64(rng.unit() * 1.2);
        finished += kill_after(r, scratch.path(), &["clone", &r.url, cloned.to_str().unwrap()], delay) as u32;
        let what = format!("clone trial {trial}, killed after {delay:?}");
        if Repo::open(&cloned).is_ok() {
            check_store(&cloned, &what);
            if ckpt::sync::remotes(&Repo::open(&cloned).unwrap()).is_ok_and(|l| !l.is_empty()) {
                r.ok(&cloned, &["fetch", "origin"]);
                check_history(&cloned, &history, &what);
            }
        }
        let again = scratch.path().join(format!("again{trial}"));
        r.ok(scratch.path(), &["clone", &r.url, again.to_str().unwrap()]);
        check_history(&again, &history, &format!("clone trial {trial}, rerun"));
        let _ = std::fs::remove_dir_all(&cloned);
        std::fs::remove_dir_all(&again).unwrap();
    }
    eprintln!("{finished} fetches/clones finished before the kill");
}

#[test]
fn kill_9_during_fetch_and_clone_from_a_directory_remote() {
    let Some(r) = directory() else { return };
    kill_fetches(&r, 11);
}

#[test]
fn kill_9_during_fetch_and_clone_from_s3() {
    let Some(r) = s3() else { return };
    kill_fetches(&r, 12);
}

/// A directory remote that logs the journal and ref writes, can fail ref writes (a push killed
/// between its uploads and moving its ref), and can be slow at its first object upload.
struct Scripted {
    inner: DirRemote,
    fail_refs: bool,
    slow_upload: Option<Duration>,
    log: Mutex<Vec<String>>,
}

impl Scripted {
    fn new(url: &str) -> Scripted {
        Scripted { inner: DirRemote::open(url).unwrap(), fail_refs: false, slow_upload: None, log: Mutex::default() }
    }
}

impl Remote for Scripted {
    fn url(&self) -> &str {
        self.inner.url()
    }
    fn list(&self, prefix: &str) -> remote::Result<Vec<String>> {
        self.inner.list(prefix)
    }
    fn list_modified(&self, prefix: &str) -> remote::Result<Vec<remote::Listed>> {
        self.inner.list_modified(prefix)
    }
    fn modified(&self, key: &str) -> remote::Result<Option<std::time::SystemTime>> {
        self.inner.modified(key)
    }
    fn get_small(&self, key: &str) -> remote::Result<Option<Small>> {
        self.inner.get_small(key)
    }
    fn put_small(&self, key: &str, bytes: &[u8], expect: &Expect) -> remote::Result<()> {
        self.log.lock().unwrap().push(format!("put {key}"));
        if self.fail_refs && key.starts_with("refs/") {
            return Err(remote::Error::NotFound { remote: "killed".into(), key: key.into() });
        }
        self.inner.put_small(key, bytes, expect)
    }
    fn upload(
        &self,
        key: &str,
        file: &std::fs::File,
        path: &Path,
        len: u64,
        mode: UploadMode,
    ) -> remote::Result<Uploaded> {
        if let Some(pause) = self.slow_upload {
            if !self.log.lock().unwrap().iter().any(|l| l == "slow") {
                self.log.lock().unwrap().push("slow".into());
                std::thread::sleep(pause);
            }
        }
        self.inner.upload(key, file, path, len, mode)
    }
    fn replace(&self, key: &str, file: &std::fs::File, path: &Path, len: u64) -> remote::Result<()> {
        if key.starts_with("pending/") {
            self.log.lock().unwrap().push(format!("replace {key}"));
        }
        self.inner.replace(key, file, path, len)
    }
    fn delete(&self, key: &str) -> remote::Result<()> {
        self.log.lock().unwrap().push(format!("delete {key}"));
        self.inner.delete(key)
    }
    fn read_head(&self, key: &str, len: u64) -> remote::Result<(Vec<u8>, u64)> {
        self.inner.read_head(key, len)
    }
    fn download(&self, key: &str, out: &mut dyn std::io::Write, limit: u64) -> remote::Result<u64> {
        self.inner.download(key, out, limit)
    }
    fn requests(&self) -> u64 {
        self.inner.requests()
    }
}

fn commit_epoch(repo: &Repo, dir: &Path, epoch: u32) -> VersionId {
    std::fs::write(dir.join("model.safetensors"), model(epoch)).unwrap();
    repo.commit(&["model.safetensors"], &format!("epoch {epoch}"), &Default::default()).unwrap()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

/// Sets the `written` time of the journal at `path` to `age` seconds ago (as if its push
/// had died that long ago).
fn age_journal(path: &Path, age: u64) {
    let mut j: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    j["written"] = serde_json::json!(unix_now() - age);
    std::fs::write(path, serde_json::to_vec(&j).unwrap()).unwrap();
}

/// A push killed before its ref moved leaves its journal; once its version is on no remote
/// ref and the journal is older than the grace period, a later push (from another clone)
/// deletes it. Kept meanwhile: a young one, an old one whose version a ref reaches, and
/// bytes under `pending/` that are not a journal. A journal of an older ckpt (no time) is
/// stamped first and deleted a grace period later.
#[test]
fn a_later_push_removes_abandoned_journals_after_the_grace_period() {
    let r = directory().unwrap();
    let pending = r.objects.parent().unwrap().join("pending");
    let work = tempfile::tempdir().unwrap();
    let a_dir = work.path().join("a");
    let a = Repo::init(&a_dir).unwrap();
    let options = PushOptions { transfers: 2, ..PushOptions::default() };
    let e0 = commit_epoch(&a, &a_dir, 0);
    ckpt::sync::push_to(&a, &DirRemote::create(&r.url).unwrap(), &options).unwrap();
    let e1 = commit_epoch(&a, &a_dir, 1);
    let killed = Scripted { fail_refs: true, ..Scripted::new(&r.url) };
    assert!(ckpt::sync::push_to(&a, &killed, &options).is_err(), "the push dies before its ref moves");
    let abandoned = pending.join(e1.to_hex());
    assert!(abandoned.is_file(), "the killed push left its journal");

    // Forged: an old journal of e0 for a branch the remote lacks (e0 stays reachable from
    // main: kept), one of an older ckpt without a time (of a version no ref reaches), and
    // bytes that are not a journal.
    let reachable = pending.join(e0.to_hex());
    let journal = |version: &VersionId, branch: &str| serde_json::json!({"branch": branch, "version": version.to_hex(), "recodes": []});
    let mut old = journal(&e0, "gone");
    old["written"] = serde_json::json!(unix_now() - 100_000);
    std::fs::write(&reachable, serde_json::to_vec(&old).unwrap()).unwrap();
    let unstamped_version = ckpt::ObjectId::hash(b"a version pushed by an older ckpt, then killed");
    let unstamped = pending.join(unstamped_version.to_hex());
    std::fs::write(&unstamped, serde_json::to_vec(&journal(&unstamped_version, "main")).unwrap()).unwrap();
    let garbage = pending.join("not-a-journal");
    std::fs::write(&garbage, b"\xff{ not json").unwrap();

    // Another clone moves main elsewhere: e1 is now on no ref, but its journal is young.
    let b_dir = work.path().join("b");
    let (b, _) = ckpt::sync::clone_from(&r.url, &b_dir, Default::default(), 2, None).unwrap();
    commit_epoch(&b, &b_dir, 101);
    let remote = DirRemote::open(&r.url).unwrap();
    ckpt::sync::push_to(&b, &remote, &options).unwrap();
    assert!(abandoned.is_file(), "a journal younger than the grace period is kept");
    assert!(reachable.is_file() && garbage.is_file());
    let stamped: serde_json::Value = serde_json::from_slice(&std::fs::read(&unstamped).unwrap()).unwrap();
    assert!(stamped["written"].as_u64().unwrap() + 60 > unix_now(), "stamped now: {stamped}");

    age_journal(&abandoned, 2 * 3600);
    commit_epoch(&b, &b_dir, 102);
    ckpt::sync::push_to(&b, &remote, &options).unwrap();
    assert!(!abandoned.exists(), "the abandoned journal is gone");
    assert!(unstamped.is_file(), "the stamped one waits a grace period from its stamp");
    assert!(reachable.is_file(), "a journal whose version a ref reaches is kept");
    assert!(garbage.is_file(), "bytes that are not a journal are left alone");

    age_journal(&unstamped, 2 * 3600);
    ckpt::sync::push_to(&b, &remote, &options).unwrap();
    assert!(!unstamped.exists(), "gone a grace period after its stamp");
    // A's rerun is rejected (main moved on), and the remote is intact.
    assert!(ckpt::sync::push_to(&a, &remote, &options).is_err());
    let c = tempfile::tempdir().unwrap();
    let (clone, _) = ckpt::sync::clone_from(&r.url, &c.path().join("c"), Default::default(), 2, None).unwrap();
    assert!(clone.verify().unwrap().is_ok());
}

/// A push whose upload outlasts half the grace period writes its journal again just before
/// it moves its ref, so that no other push takes it as abandoned while it may still move
/// the ref; a quick push writes it once.
#[test]
fn a_slow_push_refreshes_its_journal_before_moving_its_ref() {
    for (grace, pause, writes) in [(2, Duration::from_millis(1100), 2), (3600, Duration::ZERO, 1)] {
        let r = directory().unwrap();
        let work = tempfile::tempdir().unwrap();
        let dir = work.path();
        Repo::init(dir).unwrap();
        std::fs::write(
            dir.join(".ckpt/config"),
            serde_json::to_vec(&Config { gc_grace_seconds: grace, ..Config::default() }).unwrap(),
        )
        .unwrap();
        let repo = Repo::open(dir).unwrap();
        let options = PushOptions { transfers: 2, ..PushOptions::default() };
        commit_epoch(&repo, dir, 0);
        ckpt::sync::push_to(&repo, &DirRemote::create(&r.url).unwrap(), &options).unwrap();
        let tip = commit_epoch(&repo, dir, 1);
        let slow = Scripted { slow_upload: Some(pause), ..Scripted::new(&r.url) };
        ckpt::sync::push_to(&repo, &slow, &options).unwrap();
        let log = slow.log.into_inner().unwrap();
        let journal = format!("pending/{}", tip.to_hex());
        let replaced: Vec<usize> =
            log.iter().enumerate().filter(|(_, l)| **l == format!("replace {journal}")).map(|(i, _)| i).collect();
        let moved = log.iter().position(|l| l == "put refs/heads/main").expect("the ref moved");
        let deleted = log.iter().position(|l| *l == format!("delete {journal}")).expect("the journal was deleted");
        assert_eq!(replaced.len(), writes, "grace {grace}: {log:?}");
        assert!(replaced.iter().all(|i| *i < moved) && moved < deleted, "{log:?}");
    }
}

/// A directory remote whose first blob download waits until released.
struct Held {
    inner: DirRemote,
    skip: String,
    waiting: AtomicBool,
    release: AtomicBool,
}

impl Remote for Held {
    fn url(&self) -> &str {
        self.inner.url()
    }
    fn list(&self, prefix: &str) -> remote::Result<Vec<String>> {
        self.inner.list(prefix)
    }
    fn list_modified(&self, prefix: &str) -> remote::Result<Vec<remote::Listed>> {
        self.inner.list_modified(prefix)
    }
    fn modified(&self, key: &str) -> remote::Result<Option<std::time::SystemTime>> {
        self.inner.modified(key)
    }
    fn get_small(&self, key: &str) -> remote::Result<Option<Small>> {
        self.inner.get_small(key)
    }
    fn put_small(&self, key: &str, bytes: &[u8], expect: &Expect) -> remote::Result<()> {
        self.inner.put_small(key, bytes, expect)
    }
    fn upload(
        &self,
        key: &str,
        file: &std::fs::File,
        path: &Path,
        len: u64,
        mode: UploadMode,
    ) -> remote::Result<Uploaded> {
        self.inner.upload(key, file, path, len, mode)
    }
    fn replace(&self, key: &str, file: &std::fs::File, path: &Path, len: u64) -> remote::Result<()> {
        self.inner.replace(key, file, path, len)
    }
    fn delete(&self, key: &str) -> remote::Result<()> {
        self.inner.delete(key)
    }
    fn read_head(&self, key: &str, len: u64) -> remote::Result<(Vec<u8>, u64)> {
        self.inner.read_head(key, len)
    }
    fn download(&self, key: &str, out: &mut dyn std::io::Write, limit: u64) -> remote::Result<u64> {
        if key != self.skip && !self.waiting.swap(true, Ordering::SeqCst) {
            let start = Instant::now();
            while !self.release.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(60) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.inner.download(key, out, limit)
    }
    fn requests(&self) -> u64 {
        self.inner.requests()
    }
}

/// The git filter's smudge of a file the store lacks (`fetch_file`) downloads without the
/// store's writer lock: while a download hangs, a commit (a git clean in another worktree) of
/// the same store completes in another process; the file arrives whole afterwards.
#[test]
fn a_smudge_download_does_not_block_a_clean_of_the_same_store() {
    let r = directory().unwrap();
    let work = tempfile::tempdir().unwrap();
    let a_dir = work.path().join("a");
    let a = Repo::init(&a_dir).unwrap();
    let tip = commit_epoch(&a, &a_dir, 0);
    ckpt::sync::push_to(&a, &DirRemote::create(&r.url).unwrap(), &PushOptions::default()).unwrap();
    let manifest = a.version(&tip).unwrap().files[0].manifest;

    let b_dir = work.path().join("b");
    let b = Repo::init(&b_dir).unwrap();
    let held = Held {
        inner: DirRemote::open(&r.url).unwrap(),
        skip: ckpt::remote::object_key(&manifest),
        waiting: AtomicBool::new(false),
        release: AtomicBool::new(false),
    };
    std::thread::scope(|scope| {
        let fetching = scope.spawn(|| ckpt::sync::fetch_file(&b, &held, &manifest));
        let start = Instant::now();
        while !held.waiting.load(Ordering::SeqCst) {
            assert!(start.elapsed() < Duration::from_secs(30), "the download did not start");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::write(b_dir.join("other.safetensors"), model(7)).unwrap();
        let mut commit = ckpt_command(&b_dir, &["commit", "-m", "meanwhile", "other.safetensors"]);
        commit.env("CKPT_LOCK_TIMEOUT", "10");
        let done = crate::support::repo_util::output_within(commit, Duration::from_secs(30));
        held.release.store(true, Ordering::SeqCst);
        let o = done.expect("the commit finished while the download hung");
        assert!(o.status.success(), "the commit failed while the download hung: {}", stderr(&o));
        let got = fetching.join().unwrap().unwrap();
        assert!(got.objects > 1, "{got:?}");
    });
    let b = Repo::open(&b_dir).unwrap();
    let m = b.manifest(&manifest).unwrap();
    let fetched = work.path().join("fetched.safetensors");
    b.write_stored_file(&manifest, m.len, &m.hash, &fetched).unwrap();
    assert!(std::fs::read(&fetched).unwrap() == model(0), "the fetched file is bit-exact");
    let report = b.verify().unwrap();
    assert!(report.is_ok(), "{report:?}");
    let out = tempfile::tempdir().unwrap();
    b.checkout("HEAD", None, Some(out.path()), None).unwrap();
    assert_eq!(std::fs::read(out.path().join("other.safetensors")).unwrap(), model(7));
}
