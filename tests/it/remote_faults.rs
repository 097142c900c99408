//! Remotes under faults, through the `ckpt` binary against a real S3-protocol server (`s3s-fs` on
//! a loopback port, skipped with a message when it is not installed; `CKPT_REQUIRE_S3S=1` makes
//! that a failure) with a fault-injecting proxy in between (`support/proxy.rs`): connections cut or
//! stalled mid-upload and mid-download, an answer lost after the server acted, the server killed
//! and restarted mid-push. Each time the command completes (retries) or fails naming the remote,
//! a rerun completes, and both sides are valid: `ckpt verify` passes on the pushing side and a
//! fresh clone, straight from the server, is bit-exact. Also: the requests of a push that has
//! nothing to send, counted on the wire, and an object altered on the remote (directory and S3).

use crate::support::proxy::{Direction, Fault, Proxy};
use crate::support::repo_util::{ckpt_command, read_tree, stderr, synthetic_checkpoint, TRAINING_MODEL};
use ckpt::Dtype;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BUCKET: &str = "ckpt-faults";
const PREFIX: &str = "team/run";
const ACCESS_KEY: &str = "ckpt-faults-key";
const SECRET_KEY: &str = "ckpt-faults-secret-do-not-print";

/// An `s3s-fs` server on a loopback port with a temporary root, which can be killed and
/// restarted on the same root and port; killed when dropped.
struct Server {
    child: Option<Child>,
    root: tempfile::TempDir,
    port: u16,
}

impl Server {
    /// Starts one, or `None` (with a message) when `s3s-fs` is not installed.
    fn start() -> Option<Server> {
        if Command::new("s3s-fs").arg("--help").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
            crate::support::skip(
                "s3s-fs is not on PATH (cargo install s3s-fs --version 0.14.1 --features binary)",
                "CKPT_REQUIRE_S3S",
            );
            return None;
        }
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join(BUCKET)).unwrap();
        let mut server = Server { child: None, root, port: 0 };
        for _ in 0..5 {
            server.port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            if server.spawn() {
                return Some(server);
            }
        }
        panic!("s3s-fs did not start");
    }

    /// Starts `s3s-fs` on this root and port; whether it is accepting connections.
    fn spawn(&mut self) -> bool {
        let mut child = Command::new("s3s-fs")
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(self.root.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start s3s-fs");
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                self.child = Some(child);
                return true;
            }
            if child.try_wait().unwrap().is_some() {
                return false; // the port was taken meanwhile
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    /// Kills it (SIGKILL: no chance to finish what it was writing).
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Where the remote's files are on the server's disk.
    fn remote_dir(&self) -> PathBuf {
        self.root.path().join(BUCKET).join(PREFIX)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A server, a proxy in front of it, and how to run `ckpt` against either.
struct Setup {
    proxy: Proxy,
    server: Server,
    url: String,
}

fn setup() -> Option<Setup> {
    let server = Server::start()?;
    let proxy = Proxy::start(server.port);
    Some(Setup { proxy, server, url: format!("s3://{BUCKET}/{PREFIX}") })
}

/// How a command reaches the server.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    Proxy,
    Direct,
}

impl Setup {
    /// `ckpt ARGS` in `dir`, reaching the server `via`, with a stall timeout of `timeout` seconds.
    fn command(&self, dir: &Path, args: &[&str], via: Via, timeout: &str) -> Command {
        let port = if via == Via::Proxy { self.proxy.port() } else { self.server.port };
        let mut c = ckpt_command(dir, args);
        c.env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}"))
            .env("AWS_ALLOW_HTTP", "true")
            .env("CKPT_REMOTE_TIMEOUT", timeout);
        c
    }

    /// Runs `ckpt ARGS` (stall timeout 5 s, so that a hang fails the test quickly).
    fn run(&self, dir: &Path, args: &[&str], via: Via) -> Output {
        self.run_with_timeout(dir, args, via, "5")
    }

    fn run_with_timeout(&self, dir: &Path, args: &[&str], via: Via, timeout: &str) -> Output {
        let out = self.command(dir, args, via, timeout).output().expect("run ckpt");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains(SECRET_KEY) && !stderr(&out).contains(SECRET_KEY),
            "a secret was printed"
        );
        out
    }

    fn ok(&self, dir: &Path, args: &[&str], via: Via) -> Output {
        let out = self.run(dir, args, via);
        assert!(out.status.success(), "ckpt {args:?} failed: {}", stderr(&out));
        out
    }

    /// The outcome of a command run under faults: success, or a failure whose message names
    /// the remote. Returns whether it succeeded.
    fn completed_or_named_the_remote(&self, out: &Output, what: &str) -> bool {
        if out.status.success() {
            eprintln!("{what}: completed through the faults");
            return true;
        }
        eprintln!("{what}: failed, to be rerun: {}", stderr(out).trim());
        assert!(stderr(out).contains(&self.url), "{what}: the error names the remote {}: {}", self.url, stderr(out));
        false
    }

    /// Asserts that the remote is whole: a fresh clone straight from the server has `a`'s
    /// branch, every one of `versions` versions is bit-exact, and both sides verify.
    fn remote_is_whole(&self, a: &Path, versions: u32) {
        self.ok(a, &["verify"], Via::Direct);
        let parent = tempfile::tempdir().unwrap();
        self.ok(parent.path(), &["clone", &self.url, "check"], Via::Direct);
        let check = parent.path().join("check");
        assert_eq!(head_of(a), head_of(&check), "the remote's main is the pushed one");
        same_history(&|d, a| self.run(d, a, Via::Direct), a, &check, versions);
        self.ok(&check, &["verify"], Via::Direct);
    }
}

fn model(seed: u64, epoch: u32) -> Vec<u8> {
    synthetic_checkpoint(seed, Dtype::Bf16, TRAINING_MODEL, epoch)
}

/// A new working tree with `epochs` commits of `model.safetensors` (0.8 MB each) and the remote
/// as `origin`.
fn trained(s: &Setup, seed: u64, epochs: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    s.ok(dir.path(), &["init"], Via::Direct);
    for e in 0..epochs {
        std::fs::write(dir.path().join("model.safetensors"), model(seed, e)).unwrap();
        s.ok(dir.path(), &["commit", "-m", &format!("epoch {e}"), "model.safetensors"], Via::Direct);
    }
    s.ok(dir.path(), &["remote", "add", "origin", &s.url], Via::Direct);
    dir
}

fn head_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join(".ckpt/refs/heads/main")).unwrap()
}

/// Runs `ckpt ARGS` in a directory, in the environment of one remote.
type Run<'a> = &'a dyn Fn(&Path, &[&str]) -> Output;

fn ok(run: Run, dir: &Path, args: &[&str]) -> Output {
    let out = run(dir, args);
    assert!(out.status.success(), "ckpt {args:?} failed: {}", stderr(&out));
    out
}

/// `main~0` … `main~(versions-1)` checked out of both repositories are identical.
fn same_history(run: Run, a: &Path, b: &Path, versions: u32) {
    for n in 0..versions {
        let rev = format!("main~{n}");
        let (oa, ob) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        ok(run, a, &["checkout", &rev, "--output", oa.path().to_str().unwrap()]);
        ok(run, b, &["checkout", &rev, "--output", ob.path().to_str().unwrap()]);
        let (ta, tb) = (read_tree(oa.path()), read_tree(ob.path()));
        assert!(!ta.is_empty());
        assert!(ta == tb, "{rev} differs after the round trip");
    }
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).expect("json output")
}

/// Bytes that pass before a fault: less than one tensor's blob, so cuts land mid-body.
const MID_BODY: usize = 48 << 10;

#[test]
fn upload_cut_mid_body_is_retried_or_resumed() {
    let Some(s) = setup() else { return };
    let a = trained(&s, 1, 2);
    // Every upload cut: the retries give up, the push fails naming the remote, no ref moved.
    s.proxy.set(Fault::Drop { direction: Direction::Up, after: MID_BODY }, usize::MAX);
    let failed = s.run_with_timeout(a.path(), &["push"], Via::Proxy, "1");
    assert!(!s.completed_or_named_the_remote(&failed, "push"), "a push with every upload cut succeeded");
    assert!(!s.server.remote_dir().join("refs/heads/main").exists(), "a ref went up before its objects");
    // Three cuts: retried, or resumed by a rerun.
    s.proxy.clear();
    let cuts = s.proxy.hits();
    s.proxy.set(Fault::Drop { direction: Direction::Up, after: MID_BODY }, 3);
    let first = s.run(a.path(), &["push"], Via::Proxy);
    if !s.completed_or_named_the_remote(&first, "push") {
        assert!(!s.server.remote_dir().join("refs/heads/main").exists(), "a ref went up before its objects");
        s.ok(a.path(), &["push"], Via::Proxy);
    }
    assert_eq!(s.proxy.hits() - cuts, 3, "the proxy cut three uploads");
    s.remote_is_whole(a.path(), 2);
}

#[test]
fn download_cut_mid_body_is_retried_or_resumed() {
    let Some(s) = setup() else { return };
    let a = trained(&s, 2, 2);
    s.ok(a.path(), &["push"], Via::Direct);
    // Every download cut a little into its body (object_store resumes a cut download with a
    // range request, so cuts after 48 KiB let a blob through in a few attempts; after 1 KiB
    // they do not): the clone fails naming the remote and removes the repository it created.
    s.proxy.set(Fault::Drop { direction: Direction::Down, after: 1 << 10 }, usize::MAX);
    let parent = tempfile::tempdir().unwrap();
    let b = parent.path().join("b");
    let failed = s.run_with_timeout(parent.path(), &["clone", &s.url, "b"], Via::Proxy, "1");
    assert!(!s.completed_or_named_the_remote(&failed, "clone"), "a clone with every download cut succeeded");
    assert!(!b.exists(), "a failed clone leaves no repository behind");
    // A fetch into an existing repository: what arrived is valid and no ref names what did not.
    s.ok(parent.path(), &["init", "f"], Via::Direct);
    let f = parent.path().join("f");
    s.ok(&f, &["remote", "add", "origin", &s.url], Via::Direct);
    let failed = s.run_with_timeout(&f, &["fetch"], Via::Proxy, "1");
    assert!(!s.completed_or_named_the_remote(&failed, "fetch"), "a fetch with every download cut succeeded");
    s.ok(&f, &["verify"], Via::Direct);
    assert!(!f.join(".ckpt/refs/remotes/origin/main").exists(), "a ref names objects that did not arrive");
    // Three cuts: retried, or the clone is run again.
    s.proxy.clear();
    let cuts = s.proxy.hits();
    s.proxy.set(Fault::Drop { direction: Direction::Down, after: MID_BODY }, 3);
    let first = s.run(parent.path(), &["clone", &s.url, "b"], Via::Proxy);
    if !s.completed_or_named_the_remote(&first, "clone") {
        assert!(!b.exists(), "a failed clone leaves no repository behind");
        s.ok(parent.path(), &["clone", &s.url, "b"], Via::Proxy);
    }
    assert_eq!(s.proxy.hits() - cuts, 3, "the proxy cut three downloads");
    assert_eq!(head_of(a.path()), head_of(&b));
    same_history(&|d, a| s.run(d, a, Via::Direct), a.path(), &b, 2);
    s.ok(&b, &["verify"], Via::Direct);
}

/// A stalled connection costs the stall timeout (`CKPT_REMOTE_TIMEOUT`, 1 s here), not forever:
/// the request is abandoned and retried. With the default (30 s) these would take minutes.
#[test]
fn stalled_connections_time_out_and_are_retried() {
    let Some(s) = setup() else { return };
    let a = trained(&s, 3, 2);
    let limit = Duration::from_secs(20);

    s.proxy.set(Fault::Stall { direction: Direction::Up, after: MID_BODY }, 2);
    let start = Instant::now();
    let push = s.run_with_timeout(a.path(), &["push"], Via::Proxy, "1");
    if !s.completed_or_named_the_remote(&push, "push") {
        s.ok(a.path(), &["push"], Via::Proxy);
    }
    assert!(start.elapsed() < limit, "a stalled upload held the push for {:?}", start.elapsed());
    assert_eq!(s.proxy.hits(), 2, "the proxy stalled two uploads");
    s.proxy.clear();

    s.proxy.set(Fault::Stall { direction: Direction::Down, after: MID_BODY }, 2);
    let start = Instant::now();
    let parent = tempfile::tempdir().unwrap();
    let b = parent.path().join("b");
    let clone = s.run_with_timeout(parent.path(), &["clone", &s.url, "b"], Via::Proxy, "1");
    if !s.completed_or_named_the_remote(&clone, "clone") {
        s.ok(&b, &["pull"], Via::Proxy);
    }
    assert!(start.elapsed() < limit, "a stalled download held the clone for {:?}", start.elapsed());
    assert_eq!(s.proxy.hits(), 4, "the proxy stalled two downloads");
    s.proxy.clear();
    assert_eq!(head_of(a.path()), head_of(&b));
    same_history(&|d, a| s.run(d, a, Via::Direct), a.path(), &b, 2);
    s.remote_is_whole(a.path(), 2);
}

#[test]
fn a_bad_stall_timeout_is_an_error_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str], timeout: &str| {
        let mut c = ckpt_command(dir.path(), args);
        c.env("CKPT_REMOTE_TIMEOUT", timeout).env("AWS_REGION", "us-east-1").output().expect("run ckpt")
    };
    assert!(run(&["init"], "1").status.success());
    for bad in ["soon", "0", "-3"] {
        let out = run(&["remote", "add", "origin", "s3://bucket/x"], bad);
        assert!(!out.status.success(), "CKPT_REMOTE_TIMEOUT={bad} was accepted");
        assert!(stderr(&out).contains("CKPT_REMOTE_TIMEOUT"), "{}", stderr(&out));
    }
    assert!(run(&["remote", "add", "origin", "s3://bucket/x"], "2.5").status.success());
}

/// The server is killed (SIGKILL) while an upload is in flight and restarted on the same root
/// and port; the push retries or fails naming the remote, and a rerun completes.
#[test]
fn server_killed_and_restarted_mid_push() {
    let Some(mut s) = setup() else { return };
    let a = trained(&s, 4, 2);
    // Hold one upload mid-body, so the kill lands while the server is reading it.
    s.proxy.set(Fault::Stall { direction: Direction::Up, after: MID_BODY }, 1);
    let push = s.command(a.path(), &["push"], Via::Proxy, "10").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    let push = push.expect("start ckpt push");
    let start = Instant::now();
    while s.proxy.hits() == 0 {
        assert!(start.elapsed() < Duration::from_secs(20), "the push never reached the stalled upload");
        std::thread::sleep(Duration::from_millis(10));
    }
    s.server.kill();
    assert!(s.server.spawn(), "s3s-fs restarts on the same port");
    s.proxy.clear(); // the held connection, to the dead server, is closed
    let first = push.wait_with_output().unwrap();
    if !s.completed_or_named_the_remote(&first, "push") {
        s.ok(a.path(), &["push"], Via::Proxy);
    }
    s.remote_is_whole(a.path(), 2);
}

/// The server moves the ref but its answer is lost: the push must not report "fetch first"
/// (the ref holds its own version), and the remote-tracking ref must end up there.
#[test]
fn ref_update_whose_answer_is_lost() {
    let Some(s) = setup() else { return };
    let a = trained(&s, 5, 1);
    s.ok(a.path(), &["push"], Via::Direct);
    std::fs::write(a.path().join("model.safetensors"), model(5, 1)).unwrap();
    s.ok(a.path(), &["commit", "-m", "epoch 1", "model.safetensors"], Via::Direct);
    s.proxy.set(Fault::LoseAnswer { method: "PUT", path: "refs/heads/main" }, 1);
    let first = s.run(a.path(), &["push"], Via::Proxy);
    assert_eq!(s.proxy.hits(), 1, "the ref's answer was lost");
    assert!(!stderr(&first).contains("fetch first"), "{}", stderr(&first));
    if !s.completed_or_named_the_remote(&first, "push") {
        s.ok(a.path(), &["push"], Via::Proxy);
    }
    let tracking = std::fs::read_to_string(a.path().join(".ckpt/refs/remotes/origin/main")).unwrap();
    assert_eq!(tracking, head_of(a.path()), "origin/main is where the remote's main is");
    s.remote_is_whole(a.path(), 2);
}

/// A second push of the same versions sends nothing, in at most 10 requests counted on the wire
/// (and the count ckpt reports is the one on the wire).
#[test]
fn a_second_push_sends_nothing_in_at_most_ten_requests() {
    let Some(s) = setup() else { return };
    let a = trained(&s, 6, 3);
    s.ok(a.path(), &["tag", "v1", "HEAD~1"], Via::Direct);
    s.ok(a.path(), &["branch", "side", "HEAD~2"], Via::Direct);
    let first = json(&s.ok(a.path(), &["push", "--all", "--json"], Via::Proxy));
    assert!(first["objects_sent"].as_u64().unwrap() > 0);
    let sent = s.proxy.requests();
    assert_eq!(first["requests"].as_u64().unwrap() as usize, sent.len(), "{sent:#?}");
    for args in [&["push", "--json"][..], &["push", "--all", "--json"][..]] {
        s.proxy.reset_requests();
        let again = json(&s.ok(a.path(), args, Via::Proxy));
        let seen = s.proxy.requests();
        assert_eq!(again["objects_sent"], 0, "{again}");
        assert_eq!(again["bytes_sent"], 0, "{again}");
        assert!(seen.len() <= 10, "{args:?}: {} requests: {seen:#?}", seen.len());
        assert!(seen.iter().all(|r| r.starts_with("GET ") || r.starts_with("HEAD ")), "{seen:#?}");
        assert_eq!(again["requests"].as_u64().unwrap() as usize, seen.len(), "{again} vs {seen:#?}");
    }
}

// ---- an object altered on the remote, on a fetch into an existing clone ----------------------

/// Object files under a remote's `objects/` (s3s-fs keeps metadata files beside them).
fn object_files(objects: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for fan in std::fs::read_dir(objects).unwrap() {
        let fan = fan.unwrap().path();
        if !fan.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&fan).unwrap() {
            let p = f.unwrap().path();
            if p.file_name().unwrap().len() == 62 {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn id_of(object: &Path) -> String {
    let fan = object.parent().unwrap().file_name().unwrap().to_string_lossy().into_owned();
    fan + &object.file_name().unwrap().to_string_lossy()
}

/// `b` cloned version 0; `a` pushes version 1; the largest object version 1 added is altered on
/// the remote (at `objects`, on disk): `b`'s fetch refuses it naming it, stores nothing of it and
/// leaves `origin/main` where it was; once the object is repaired, the fetch completes.
fn fetch_refuses_an_altered_object(run: Run, url: &str, objects: &Path) {
    let a = tempfile::tempdir().unwrap();
    ok(run, a.path(), &["init"]);
    std::fs::write(a.path().join("model.safetensors"), model(7, 0)).unwrap();
    ok(run, a.path(), &["commit", "-m", "epoch 0", "model.safetensors"]);
    ok(run, a.path(), &["remote", "add", "origin", url]);
    ok(run, a.path(), &["push"]);
    let parent = tempfile::tempdir().unwrap();
    ok(run, parent.path(), &["clone", url, "b"]);
    let b = parent.path().join("b");
    let before = object_files(objects);
    std::fs::write(a.path().join("model.safetensors"), model(7, 1)).unwrap();
    ok(run, a.path(), &["commit", "-m", "epoch 1", "model.safetensors"]);
    ok(run, a.path(), &["push"]);
    let added: Vec<PathBuf> = object_files(objects).into_iter().filter(|p| !before.contains(p)).collect();
    let victim = added.iter().max_by_key(|p| std::fs::metadata(p).unwrap().len()).expect("the push added objects");
    let id = id_of(victim);
    let good = std::fs::read(victim).unwrap();
    let mut bad = good.clone();
    let at = bad.len() * 2 / 3;
    bad[at] ^= 0x10;
    // Replaced, not written into: a directory remote's objects may be read-only files.
    let replace = |bytes: &[u8]| {
        std::fs::remove_file(victim).unwrap();
        std::fs::write(victim, bytes).unwrap();
    };
    replace(&bad);

    let tracking = b.join(".ckpt/refs/remotes/origin/main");
    let old = std::fs::read_to_string(&tracking).unwrap();
    let out = run(&b, &["fetch"]);
    assert!(!out.status.success(), "a fetch with an altered object must fail");
    assert!(stderr(&out).contains(&id), "the error names the object {id}: {}", stderr(&out));
    assert!(!b.join(".ckpt/objects").join(&id[..2]).join(&id[2..]).exists(), "the altered object was stored");
    assert_eq!(std::fs::read_to_string(&tracking).unwrap(), old, "origin/main moved to a version not all here");
    ok(run, &b, &["verify"]);

    replace(&good);
    ok(run, &b, &["fetch"]);
    assert_eq!(std::fs::read_to_string(&tracking).unwrap(), head_of(a.path()));
    ok(run, &b, &["pull"]);
    same_history(run, a.path(), &b, 2);
}

#[test]
fn fetch_refuses_an_altered_object_on_s3() {
    let Some(s) = setup() else { return };
    let objects = s.server.remote_dir().join("objects");
    fetch_refuses_an_altered_object(&|d, a| s.run(d, a, Via::Direct), &s.url, &objects);
}

#[test]
fn fetch_refuses_an_altered_object_in_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let remote = dir.path().join("remote");
    let run = |d: &Path, a: &[&str]| ckpt_command(d, a).output().expect("run ckpt");
    fetch_refuses_an_altered_object(&run, remote.to_str().unwrap(), &remote.join("objects"));
}

/// A multipart upload whose parts are cut mid-body: each part is retried alone, and the object
/// that arrives is the file, byte for byte.
#[test]
fn multipart_upload_with_parts_cut_mid_body() {
    use ckpt::remote::{Remote, UploadMode, Uploaded};
    let Some(s) = setup() else { return };
    let options = ckpt::remote::S3Options {
        endpoint: Some(s.proxy.endpoint()),
        region: Some("us-east-1".into()),
        allow_http: true,
    };
    let remote = ckpt::remote::s3::StoreRemote::s3_with_credentials(&s.url, &options, ACCESS_KEY, SECRET_KEY)
        .unwrap()
        .with_part_size(5 << 20);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big");
    let data = crate::support::util::noise(21, 21 << 20);
    std::fs::write(&path, &data).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let key = ckpt::remote::object_key(&ckpt::ObjectId::hash(&data));
    s.proxy.set(Fault::Drop { direction: Direction::Up, after: 3 << 20 }, 2);
    let uploaded = remote.upload(&key, &file, &path, data.len() as u64, UploadMode::MayReplace);
    assert_eq!(s.proxy.hits(), 2, "the proxy cut two parts");
    assert_eq!(uploaded.unwrap(), Uploaded::Replaced, "a multipart upload cannot be conditional");
    let mut back = Vec::new();
    remote.download(&key, &mut back, u64::MAX).unwrap();
    assert!(back == data, "the object that arrived is not the file");
}

/// A push that finds the remote's branch already at its version still records where the remote
/// is (after a push whose answer was lost and which failed, the rerun finds it up to date).
#[test]
fn an_up_to_date_push_records_the_remote_tracking_ref() {
    let dir = tempfile::tempdir().unwrap();
    let url = dir.path().join("remote").to_str().unwrap().to_string();
    let run = |d: &Path, a: &[&str]| ckpt_command(d, a).output().expect("run ckpt");
    let a = tempfile::tempdir().unwrap();
    ok(&run, a.path(), &["init"]);
    std::fs::write(a.path().join("model.safetensors"), model(9, 0)).unwrap();
    ok(&run, a.path(), &["commit", "-m", "epoch 0", "model.safetensors"]);
    ok(&run, a.path(), &["remote", "add", "origin", &url]);
    ok(&run, a.path(), &["push"]);
    let tracking = a.path().join(".ckpt/refs/remotes/origin/main");
    std::fs::remove_file(&tracking).unwrap();
    let again = ok(&run, a.path(), &["push"]);
    assert!(stderr(&again).contains("up to date"), "{}", stderr(&again));
    assert_eq!(std::fs::read_to_string(&tracking).unwrap(), head_of(a.path()));
}
