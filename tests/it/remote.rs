//! Remotes: push, clone, fetch, pull through the `ckpt` binary, against a directory remote and
//! against a real S3-protocol server (`s3s-fs` on a loopback port, started per test; those
//! tests are skipped with a message when `s3s-fs` is not on PATH), and the same against Azurite
//! and a GCS emulator. Conditional puts and multipart uploads run in-process against S3 and
//! Azurite, a compare-and-swap race against Azurite (s3s-fs's conditional writes are not atomic;
//! the GCS emulator honours no generation precondition and has no XML multipart uploads:
//! `support::clouds`). Interrupted transfers are tested in-process through a remote
//! that fails after N operations.

use crate::support::remote::{
    azure_client, azurite, directory, json, model, s3, trained, S3Server, Served, ACCESS_KEY, BUCKET, SECRET_KEY,
};
use crate::support::repo_util::{read_tree, stderr};
use ckpt::remote::{self, Expect, Remote, Small, UploadMode, Uploaded};
use ckpt::repo::Repo;
use ckpt::sync::PushOptions;
use std::path::{Path, PathBuf};

fn head_of(dir: &Path, branch: &str) -> String {
    std::fs::read_to_string(dir.join(".ckpt/refs/heads").join(branch)).unwrap()
}

/// Every version along `rev`'s history, checked out in both repositories, is identical.
fn same_history(r: &Served, a: &Path, b: &Path, rev: &str, versions: u32) {
    for n in 0..versions {
        let rev = format!("{rev}~{n}");
        let (oa, ob) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        r.ok(a, &["checkout", &rev, "--output", oa.path().to_str().unwrap()]);
        r.ok(b, &["checkout", &rev, "--output", ob.path().to_str().unwrap()]);
        let (ta, tb) = (read_tree(oa.path()), read_tree(ob.path()));
        assert!(!ta.is_empty());
        assert!(ta == tb, "{rev} differs after the round trip");
    }
}

fn push_clone_and_round_trip(r: &Served) {
    let a = trained(r, 1, 3);
    r.ok(a.path(), &["tag", "v1", "HEAD~1"]);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    let listed = String::from_utf8_lossy(&r.ok(a.path(), &["remote", "-v"]).stdout).into_owned();
    assert!(listed.contains("origin") && listed.contains(&r.url), "{listed}");
    let first = json(&r.ok(a.path(), &["push", "--all", "--json"]));
    assert!(first["objects_sent"].as_u64().unwrap() > 0);

    // A second push of the same version uploads nothing, in at most 10 requests.
    let again = json(&r.ok(a.path(), &["push", "--json"]));
    assert_eq!(again["objects_sent"], 0, "{again}");
    assert!(again["requests"].as_u64().unwrap() <= 10, "{again}");

    let parent = tempfile::tempdir().unwrap();
    r.ok(parent.path(), &["clone", &r.url, "b"]);
    let b = parent.path().join("b");
    assert_eq!(head_of(a.path(), "main"), head_of(&b, "main"));
    assert_eq!(std::fs::read(b.join("model.safetensors")).unwrap(), model(1, 2), "clone checks out main");
    same_history(r, a.path(), &b, "main", 3);
    same_history(r, a.path(), &b, "v1", 2);
    r.ok(&b, &["verify"]);
}

fn fetch_and_pull(r: &Served) {
    let a = trained(r, 2, 1);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    let parent = tempfile::tempdir().unwrap();
    r.ok(parent.path(), &["clone", &r.url, "b"]);
    let b = parent.path().join("b");

    std::fs::write(a.path().join("model.safetensors"), model(2, 1)).unwrap();
    r.ok(a.path(), &["commit", "-m", "epoch 1", "model.safetensors"]);
    let pushed = json(&r.ok(a.path(), &["push", "--json"]));
    assert!(pushed["objects_sent"].as_u64().unwrap() > 0);

    r.ok(&b, &["fetch"]);
    let tracking = std::fs::read_to_string(b.join(".ckpt/refs/remotes/origin/main")).unwrap();
    assert_eq!(tracking, head_of(a.path(), "main"));
    assert_ne!(head_of(&b, "main"), tracking, "fetch does not move the branch");
    let out = tempfile::tempdir().unwrap();
    r.ok(&b, &["checkout", "origin/main", "--output", out.path().to_str().unwrap()]);
    assert_eq!(std::fs::read(out.path().join("model.safetensors")).unwrap(), model(2, 1));

    r.ok(&b, &["pull"]);
    assert_eq!(head_of(&b, "main"), head_of(a.path(), "main"));
    assert_eq!(std::fs::read(b.join("model.safetensors")).unwrap(), model(2, 1));
    let again = r.ok(&b, &["pull"]);
    assert!(stderr(&again).contains("already up to date"), "{}", stderr(&again));
    same_history(r, a.path(), &b, "main", 2);
}

fn two_pushers_one_branch(r: &Served) {
    let a = trained(r, 3, 1);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    let parent = tempfile::tempdir().unwrap();
    r.ok(parent.path(), &["clone", &r.url, "b"]);
    let b = parent.path().join("b");

    std::fs::write(a.path().join("model.safetensors"), model(3, 1)).unwrap();
    r.ok(a.path(), &["commit", "-m", "a's epoch 1", "model.safetensors"]);
    std::fs::write(b.join("model.safetensors"), model(33, 1)).unwrap();
    r.ok(&b, &["commit", "-m", "b's epoch 1", "model.safetensors"]);

    r.ok(a.path(), &["push"]);
    let rejected = r.ckpt(&b, &["push"]);
    assert!(!rejected.status.success());
    assert!(stderr(&rejected).contains("fetch first"), "{}", stderr(&rejected));
    // The remote still has a's version.
    let check = tempfile::tempdir().unwrap();
    r.ok(check.path(), &["clone", &r.url, "c"]);
    assert_eq!(head_of(&check.path().join("c"), "main"), head_of(a.path(), "main"));

    // A plain pull cannot fast-forward and says so; pull --rebase puts b's version on top.
    let diverged = r.ckpt(&b, &["pull"]);
    assert!(!diverged.status.success());
    assert!(stderr(&diverged).contains("diverged"), "{}", stderr(&diverged));
    r.ok(&b, &["pull", "--rebase"]);
    assert_eq!(std::fs::read(b.join("model.safetensors")).unwrap(), model(33, 1), "b keeps its files");
    r.ok(&b, &["push"]);
    r.ok(a.path(), &["pull"]);
    assert_eq!(head_of(a.path(), "main"), head_of(&b, "main"));
    assert_eq!(std::fs::read(a.path().join("model.safetensors")).unwrap(), model(33, 1));
    // a's version is the parent of b's.
    let out = tempfile::tempdir().unwrap();
    r.ok(a.path(), &["checkout", "main~1", "--output", out.path().to_str().unwrap()]);
    assert_eq!(std::fs::read(out.path().join("model.safetensors")).unwrap(), model(3, 1));
    r.ok(a.path(), &["verify"]);
}

/// The largest object file under `objects` (a blob).
fn largest_object(objects: &Path) -> PathBuf {
    let mut best: Option<(u64, PathBuf)> = None;
    for fan in std::fs::read_dir(objects).unwrap() {
        let fan = fan.unwrap().path();
        if !fan.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&fan).unwrap() {
            let p = f.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name.len() != 62 {
                continue; // s3s-fs keeps metadata files beside the objects
            }
            let len = std::fs::metadata(&p).unwrap().len();
            if best.as_ref().is_none_or(|(l, _)| len > *l) {
                best = Some((len, p));
            }
        }
    }
    best.unwrap().1
}

fn damaged_object_is_refused(r: &Served) {
    let a = trained(r, 4, 2);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    let victim = largest_object(&r.objects);
    let id = format!(
        "{}{}",
        victim.parent().unwrap().file_name().unwrap().to_string_lossy(),
        victim.file_name().unwrap().to_string_lossy()
    );
    let mut bytes = std::fs::read(&victim).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&victim, &bytes).unwrap();

    let parent = tempfile::tempdir().unwrap();
    let out = r.ckpt(parent.path(), &["clone", &r.url, "b"]);
    assert!(!out.status.success(), "a clone with a damaged object must fail");
    assert!(stderr(&out).contains(&id), "the error names the object {id}: {}", stderr(&out));
    let stored = parent.path().join("b/.ckpt/objects").join(&id[..2]).join(&id[2..]);
    assert!(!stored.exists(), "the damaged object was stored");
    // Nothing names a version whose objects are missing: the clone has no branch.
    assert!(!parent.path().join("b/.ckpt/refs/remotes/origin/main").exists());
}

crate::support::remote::remote_suite!(
    push_clone_and_round_trip,
    fetch_and_pull,
    two_pushers_one_branch,
    damaged_object_is_refused;
    clouds: push_clone_and_round_trip, fetch_and_pull, two_pushers_one_branch
);

// ---- interrupted transfers, in-process ------------------------------------------------------

/// A remote that fails every upload and download after the first `budget` ones, as a dropped
/// connection would (the real remote's own retries are not modelled here).
struct Flaky<'a> {
    inner: &'a dyn Remote,
    budget: std::sync::atomic::AtomicI64,
}

impl Flaky<'_> {
    fn spend(&self) -> remote::Result<()> {
        if self.budget.fetch_sub(1, std::sync::atomic::Ordering::SeqCst) <= 0 {
            return Err(remote::Error::Backend {
                remote: "flaky".into(),
                action: "sending",
                key: "-".into(),
                source: "connection reset".into(),
            });
        }
        Ok(())
    }
}

impl Remote for Flaky<'_> {
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
        self.spend()?;
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
        self.spend()?;
        self.inner.download(key, out, limit)
    }
    fn requests(&self) -> u64 {
        self.inner.requests()
    }
}

fn library_repo(seed: u64, epochs: u32) -> (tempfile::TempDir, Repo) {
    let dir = tempfile::tempdir().unwrap();
    let repo = Repo::init(dir.path()).unwrap();
    for e in 0..epochs {
        std::fs::write(dir.path().join("model.safetensors"), model(seed, e)).unwrap();
        repo.commit(&["model.safetensors"], &format!("epoch {e}"), &Default::default()).unwrap();
    }
    (dir, repo)
}

fn interrupted_push_and_fetch_resume(inner: &dyn Remote) {
    let (_a_dir, a) = library_repo(5, 3);
    let options = PushOptions { transfers: 1, ..PushOptions::default() };
    let flaky = Flaky { inner, budget: 5.into() };
    assert!(ckpt::sync::push_to(&a, &flaky, &options).is_err(), "the push is cut off");
    assert!(inner.get_small("refs/heads/main").unwrap().is_none(), "no ref before all the objects");
    let resumed = ckpt::sync::push_to(&a, inner, &options).unwrap();
    assert_eq!(resumed.objects_present, 5, "the rerun skips what arrived: {resumed:?}");
    assert!(resumed.objects_sent > 0);

    let (_b_dir, b) = library_repo(0, 0);
    // 3 versions and 3 manifests, then 3 blobs get through.
    let flaky = Flaky { inner, budget: 9.into() };
    assert!(ckpt::sync::fetch_from(&b, &flaky, "origin", 1).is_err(), "the fetch is cut off");
    assert!(b.resolve("origin/main").is_err(), "no remote ref before all the objects");
    let report = b.verify().unwrap();
    assert!(report.is_ok(), "what arrived is valid: {report:?}");
    let kept = b.store().list().unwrap().len();
    assert!(kept > 0, "blobs that arrived are kept");
    let total = a.reachable(&[a.resolve("main").unwrap()], &|_| false).unwrap().len();
    let fetched = ckpt::sync::fetch_from(&b, inner, "origin", 2).unwrap();
    assert_eq!(fetched.objects_received as usize, total - kept, "the rerun fetches only what is missing");
    assert_eq!(b.resolve("origin/main").unwrap(), a.resolve("main").unwrap());
    for n in 0..3 {
        let (oa, ob) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        a.checkout(&format!("main~{n}"), None, Some(oa.path()), None).unwrap();
        b.checkout(&format!("origin/main~{n}"), None, Some(ob.path()), None).unwrap();
        assert!(read_tree(oa.path()) == read_tree(ob.path()), "main~{n} differs");
    }
    let report = b.verify().unwrap();
    assert!(report.is_ok(), "verify: {report:?}");
}

#[test]
fn interrupted_push_and_fetch_resume_on_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let remote = remote::local::DirRemote::create(dir.path().join("r").to_str().unwrap()).unwrap();
    interrupted_push_and_fetch_resume(&remote);
}

#[test]
fn interrupted_push_and_fetch_resume_in_memory() {
    interrupted_push_and_fetch_resume(&remote::s3::StoreRemote::memory());
}

/// The test's own client of an `s3s-fs` server (credentials passed in, not through the
/// environment: tests run as threads of one process).
fn s3_client(server: &S3Server) -> remote::s3::StoreRemote {
    let options = remote::S3Options {
        endpoint: Some(format!("http://127.0.0.1:{}", server.port)),
        region: Some("us-east-1".into()),
        allow_http: true,
    };
    remote::s3::StoreRemote::s3_with_credentials(&format!("s3://{BUCKET}/lib"), &options, ACCESS_KEY, SECRET_KEY)
        .unwrap()
}

#[test]
fn interrupted_push_and_fetch_resume_on_s3() {
    let Some(server) = S3Server::start() else { return };
    interrupted_push_and_fetch_resume(&s3_client(&server));
}

#[test]
fn s3_conditional_puts_and_multipart_uploads() {
    let Some(server) = S3Server::start() else { return };
    conditional_puts_and_multipart_uploads(&s3_client(&server).with_part_size(5 << 20));
}

#[test]
fn azure_conditional_puts_and_multipart_uploads() {
    let Some(r) = azurite() else { return };
    conditional_puts_and_multipart_uploads(&azure_client(&r).unwrap().with_part_size(5 << 20));
}

#[test]
fn azure_compare_and_swap_race_has_one_winner() {
    let Some(r) = azurite() else { return };
    compare_and_swap_race_has_one_winner(&azure_client(&r).unwrap());
}

/// Eight writers move one ref from the same version at once, each comparing against the tag
/// it read: exactly one wins, the others get `Conflict`, and the ref holds the winner's bytes.
/// Then creating the ref again (`Expect::Absent`) at once: one wins again. Run against Azurite,
/// whose conditional writes are atomic as the clouds' are: s3s-fs checks `If-Match` apart from
/// the write (all eight won there), and the GCS emulator ignores generation preconditions.
fn compare_and_swap_race_has_one_winner(remote: &(dyn Remote + Sync)) {
    remote.put_small("refs/heads/race", b"start\n", &Expect::Absent).unwrap();
    let seen = remote.get_small("refs/heads/race").unwrap().unwrap();
    let barrier = std::sync::Barrier::new(8);
    let outcomes: Vec<(usize, remote::Result<()>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (barrier, tag) = (&barrier, seen.tag.clone());
                s.spawn(move || {
                    barrier.wait();
                    (i, remote.put_small("refs/heads/race", format!("writer {i}\n").as_bytes(), &Expect::Tag(tag)))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let winners: Vec<usize> = outcomes.iter().filter(|(_, r)| r.is_ok()).map(|(i, _)| *i).collect();
    assert_eq!(winners.len(), 1, "{outcomes:?}");
    assert!(
        outcomes.iter().all(|(_, r)| r.is_ok() || matches!(r, Err(remote::Error::Conflict { .. }))),
        "{outcomes:?}"
    );
    let now = remote.get_small("refs/heads/race").unwrap().unwrap();
    assert_eq!(now.bytes, format!("writer {}\n", winners[0]).into_bytes());

    let created: Vec<bool> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    remote.put_small("refs/tags/race", format!("{i}\n").as_bytes(), &Expect::Absent).is_ok()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(created.iter().filter(|c| **c).count(), 1, "{created:?}");
}

/// Compare-and-swap and multipart uploads on a real server (`remote` in 5 MiB parts).
fn conditional_puts_and_multipart_uploads(s3: &remote::s3::StoreRemote) {
    // Compare-and-swap on a real server: a stale ETag loses, the ref keeps the winner's value.
    s3.put_small("refs/heads/main", b"one\n", &Expect::Absent).unwrap();
    assert!(matches!(s3.put_small("refs/heads/main", b"two\n", &Expect::Absent), Err(remote::Error::Conflict { .. })));
    let seen = s3.get_small("refs/heads/main").unwrap().unwrap();
    s3.put_small("refs/heads/main", b"two\n", &Expect::Tag(seen.tag.clone())).unwrap();
    let lost = s3.put_small("refs/heads/main", b"three\n", &Expect::Tag(seen.tag));
    assert!(matches!(lost, Err(remote::Error::Conflict { .. })), "{lost:?}");
    assert_eq!(s3.get_small("refs/heads/main").unwrap().unwrap().bytes, b"two\n");

    // 21 MiB in 5 MiB parts (multipart from 20 MiB), and the same bytes back.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big");
    let data = crate::support::util::noise(9, 21 << 20);
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let key = remote::object_key(&ckpt::ObjectId::hash(b"big"));
    let before = s3.requests();
    assert_eq!(s3.upload(&key, &file, &path, data.len() as u64, UploadMode::MayReplace).unwrap(), Uploaded::Replaced);
    assert_eq!(s3.requests() - before, 5 + 2, "five parts, create and complete");
    let mut back = Vec::new();
    s3.download(&key, &mut back, u64::MAX).unwrap();
    assert!(back == data, "the multipart upload came back different");
    // A create-only upload of an existing key is left alone.
    std::fs::write(&path, b"other").unwrap();
    let file = std::fs::File::open(&path).unwrap();
    assert_eq!(s3.upload(&key, &file, &path, 5, UploadMode::CreateOnly).unwrap(), Uploaded::Existed);
}

/// A TCP proxy to `upstream` that cuts the first `drops` connections once they have carried
/// `after` bytes (either way), in the middle of whatever request or response is in flight.
/// Returns its port and the number of cuts still to make.
fn fault_proxy(upstream: u16, drops: usize, after: usize) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let left = Arc::new(AtomicUsize::new(drops));
    let left_in = left.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
            let carried = Arc::new(AtomicUsize::new(0));
            let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
            for (mut from, mut to) in [
                (client.try_clone().unwrap(), server.try_clone().unwrap()),
                (server.try_clone().unwrap(), client.try_clone().unwrap()),
            ] {
                let (carried, cut, left) = (carried.clone(), cut.clone(), left_in.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    loop {
                        let n = match from.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        let total = carried.fetch_add(n, Ordering::SeqCst) + n;
                        let doomed = total > after
                            && !cut.load(Ordering::SeqCst)
                            && left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(1)).is_ok();
                        if doomed || cut.load(Ordering::SeqCst) {
                            cut.store(true, Ordering::SeqCst);
                            let _ = from.shutdown(Shutdown::Both);
                            let _ = to.shutdown(Shutdown::Both);
                            break;
                        }
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(Shutdown::Write);
                });
            }
        }
    });
    (port, left)
}

#[test]
fn dropped_connections_mid_transfer_are_retried_or_resumed() {
    let Some(served) = s3() else { return };
    let server = served._server.as_ref().unwrap();
    let a = trained(&served, 6, 2);
    let (port, left) = fault_proxy(server.port, 4, 4 << 10);
    let mut through_proxy = Served {
        url: served.url.clone(),
        env: served.env.clone(),
        objects: served.objects.clone(),
        _dir: None,
        _server: None,
        _cloud: None,
    };
    for (k, v) in through_proxy.env.iter_mut() {
        if *k == "AWS_ENDPOINT_URL" {
            *v = format!("http://127.0.0.1:{port}");
        }
    }
    let r = &through_proxy;
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    // Each command either completes through the cuts (retries) or fails naming the remote;
    // run again, it completes.
    let run = |dir: &Path, args: &[&str]| {
        let out = r.ckpt(dir, args);
        if !out.status.success() {
            assert!(stderr(&out).contains(&r.url), "the error names the remote: {}", stderr(&out));
            r.ok(dir, args);
        }
    };
    run(a.path(), &["push"]);
    let parent = tempfile::tempdir().unwrap();
    let out = r.ckpt(parent.path(), &["clone", &r.url, "b"]);
    let b = parent.path().join("b");
    if !out.status.success() {
        assert!(stderr(&out).contains(&r.url), "the error names the remote: {}", stderr(&out));
        run(&b, &["pull"]);
    }
    assert_eq!(left.load(std::sync::atomic::Ordering::SeqCst), 0, "the proxy cut connections");
    assert_eq!(head_of(a.path(), "main"), head_of(&b, "main"));
    same_history(r, a.path(), &b, "main", 2);
    r.ok(&b, &["verify"]);
}
