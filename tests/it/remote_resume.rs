//! Resumable transfers (issue 42) against a real S3-protocol server (`s3s-fs` on loopback,
//! skipped with a message when it is not installed; `CKPT_REQUIRE_S3S=1` makes that a failure),
//! with a counting proxy in between (`support/proxy.rs`): a push or a clone of a large
//! single-tensor checkpoint is killed (SIGKILL of the `ckpt` process) part way, rerun, and
//! must arrive bit-exact having sent or received again at most 10% of the object, counted in
//! bytes on the wire (what passed the proxy), not by ckpt. Also: an upload the remote aborted
//! or expired meanwhile is started over cleanly (no upload left on the server), and a damaged
//! or hostile state file is survived.
//!
//! The object is 256 MiB in parts of 5 MiB (`CKPT_PART_SIZE`, S3's smallest: 4 parts in flight
//! are what a kill can lose); `CKPT_RESUME_BYTES=N` sets
//! another size (the target is 2 GiB: `CKPT_RESUME_BYTES=2147483648`). The measured
//! fractions are printed (`--nocapture`).

use crate::support::proxy::{Direction, Proxy};
use crate::support::remote::{S3Server, ACCESS_KEY, BUCKET, SECRET_KEY};
use crate::support::repo_util::{ckpt_command, stderr, Rng};
use crate::support::util::noise;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const PREFIX: &str = "team/resume";
const PART: u64 = 5 << 20;

/// What one kill may cost again, at most: the parts in flight (4) and what sits in buffers
/// (sockets, the proxy, the download's 1 MiB write buffer).
const KILL_COSTS_AT_MOST: u64 = 4 * PART + (8 << 20);

/// The size of the test's tensor.
fn tensor_len() -> usize {
    std::env::var("CKPT_RESUME_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(256 << 20)
}

/// An `s3s-fs` server behind a counting proxy.
struct Rig {
    server: S3Server,
    proxy: Proxy,
}

impl Rig {
    fn start() -> Option<Rig> {
        let server = S3Server::start()?;
        let proxy = Proxy::start(server.port);
        Some(Rig { server, proxy })
    }

    fn url(&self) -> String {
        format!("s3://{BUCKET}/{PREFIX}")
    }

    /// `ckpt args` in `dir`, through the proxy, in parts of [`PART`].
    fn command(&self, dir: &Path, args: &[&str]) -> Command {
        let mut c = ckpt_command(dir, args);
        c.env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ENDPOINT_URL", self.proxy.endpoint())
            .env("AWS_ALLOW_HTTP", "true")
            .env("CKPT_PART_SIZE", PART.to_string());
        c
    }

    fn ok(&self, dir: &Path, args: &[&str]) -> Output {
        let out = self.command(dir, args).output().expect("run ckpt");
        assert!(out.status.success(), "ckpt {args:?} failed: {}", stderr(&out));
        out
    }

    fn carried(&self, direction: Direction) -> u64 {
        match direction {
            Direction::Up => self.proxy.bytes_up(),
            Direction::Down => self.proxy.bytes_down(),
        }
    }

    /// Runs `ckpt args` in `dir` and kills it (SIGKILL) once `at` bytes passed the proxy in
    /// `direction`; returns the bytes that passed by the time it was dead. Panics if it
    /// finished first.
    fn kill_at(&self, dir: &Path, args: &[&str], direction: Direction, at: u64) -> u64 {
        let start = self.carried(direction);
        let mut child =
            self.command(dir, args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(600);
        while self.carried(direction) - start < at {
            if let Some(status) = child.try_wait().unwrap() {
                let mut err = String::new();
                std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
                panic!("ckpt {args:?} ended ({status}) before it was killed: {err}");
            }
            assert!(Instant::now() < deadline, "ckpt {args:?} made no progress");
            std::thread::sleep(Duration::from_millis(1));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // The proxy's threads see the connections close.
        std::thread::sleep(Duration::from_millis(200));
        self.carried(direction) - start
    }

    /// Runs `ckpt args` in `dir` to its end; returns the bytes that passed in `direction`.
    fn run(&self, dir: &Path, args: &[&str], direction: Direction) -> u64 {
        let start = self.carried(direction);
        self.ok(dir, args);
        self.carried(direction) - start
    }

    /// The server's files of multipart uploads in progress (`s3s-fs` keeps them at its root).
    fn uploads_in_progress(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.server.root.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".upload"))
            .collect();
        names.sort();
        names
    }
}

/// A working tree with one committed single-tensor checkpoint of `len` bytes, and remote `origin`. Returns
/// it, the file's bytes and the stored length of its blob (the largest object).
fn committed(rig: &Rig, seed: u64, len: usize) -> (tempfile::TempDir, Vec<u8>, u64) {
    let dir = tempfile::tempdir().unwrap();
    let spec = vec![("w".to_string(), ckpt::Dtype::U8, vec![len as u64])];
    let mut file = ckpt::safetensors::write_header(&spec, None).unwrap();
    file.extend_from_slice(&noise(seed, len));
    std::fs::write(dir.path().join("model.safetensors"), &file).unwrap();
    rig.ok(dir.path(), &["init"]);
    rig.ok(dir.path(), &["commit", "-m", "big", "model.safetensors"]);
    rig.ok(dir.path(), &["remote", "add", "origin", &rig.url()]);
    let blob = largest_file(&dir.path().join(".ckpt/objects")).1;
    (dir, file, blob)
}

/// The largest file under `dir` and its length.
fn largest_file(dir: &Path) -> (PathBuf, u64) {
    let mut best = (PathBuf::new(), 0);
    for entry in walk(dir) {
        let len = std::fs::metadata(&entry).unwrap().len();
        if len > best.1 {
            best = (entry, len);
        }
    }
    best
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// The files in `dir`'s `.ckpt/transfers/` whose names start with `prefix`.
fn transfers(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    walk(&dir.join(".ckpt/transfers"))
        .into_iter()
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .collect()
}

/// The one upload state in `dir` (after a killed push).
fn upload_state(dir: &Path) -> (PathBuf, serde_json::Value) {
    let states: Vec<PathBuf> =
        transfers(dir, "up-").into_iter().filter(|p| p.extension().is_some_and(|e| e == "json")).collect();
    assert_eq!(states.len(), 1, "one upload state: {states:?}");
    let state = serde_json::from_slice(&std::fs::read(&states[0]).unwrap()).unwrap();
    (states[0].clone(), state)
}

/// A fresh clone through the proxy holds `file` as `model.safetensors`, bit for bit.
fn clone_matches(rig: &Rig, file: &[u8]) {
    let parent = tempfile::tempdir().unwrap();
    rig.ok(parent.path(), &["clone", &rig.url(), "c"]);
    assert!(std::fs::read(parent.path().join("c/model.safetensors")).unwrap() == file, "the clone differs");
}

/// What was sent twice, as a fraction of the object: the bytes of the killed runs and the
/// final run less the object once.
fn resent(carried: &[u64], object: u64) -> f64 {
    (carried.iter().sum::<u64>() as f64 - object as f64) / object as f64
}

/// Push killed at about half of its blob, rerun: the rerun resumes the multipart upload and
/// the object arrives whole, with at most 10% of it sent twice; then a clone killed at about
/// half of its download, rerun the same way (`ckpt clone` again into the same directory).
#[test]
fn push_and_clone_killed_halfway_resume_with_little_sent_twice() {
    let Some(rig) = Rig::start() else { return };
    let started = Instant::now();
    let (dir, file, blob) = committed(&rig, 1, tensor_len());
    let killed = rig.kill_at(dir.path(), &["push", "origin", "main"], Direction::Up, blob / 2);
    let (_, state) = upload_state(dir.path());
    assert!(!state["parts"].as_array().unwrap().is_empty(), "no part was kept: {state}");
    let rerun = rig.run(dir.path(), &["push", "origin", "main"], Direction::Up);
    let fraction = resent(&[killed, rerun], blob);
    eprintln!(
        "push of a {blob}-byte blob killed at {killed} bytes up: the rerun sent {rerun}, {:.2}% of the object twice",
        fraction * 100.0
    );
    assert!(fraction <= 0.10, "the rerun sent {rerun} bytes after {killed} of {blob}");
    assert!(transfers(dir.path(), "up-").is_empty(), "the upload state stays");
    assert!(rig.uploads_in_progress().is_empty(), "uploads left on the server: {:?}", rig.uploads_in_progress());
    let push_time = started.elapsed();

    let started = Instant::now();
    let parent = tempfile::tempdir().unwrap();
    let clone = ["clone", &rig.url(), "c"];
    let killed = rig.kill_at(parent.path(), &clone, Direction::Down, blob / 2);
    let c = parent.path().join("c");
    let kept = transfers(&c, "down-");
    assert_eq!(kept.len(), 1, "the partial download is kept");
    assert!(std::fs::metadata(&kept[0]).unwrap().len() > 0);
    let rerun = rig.run(parent.path(), &clone, Direction::Down);
    let fraction = resent(&[killed, rerun], blob);
    eprintln!(
        "clone of a {blob}-byte blob killed at {killed} bytes down: the rerun received {rerun}, {:.2}% of the object twice",
        fraction * 100.0
    );
    assert!(fraction <= 0.10, "the rerun received {rerun} bytes after {killed} of {blob}");
    assert!(std::fs::read(c.join("model.safetensors")).unwrap() == file, "the resumed clone differs");
    assert!(transfers(&c, "down-").is_empty() && !c.join(".ckpt/cloning").exists());
    rig.ok(&c, &["verify"]);
    eprintln!("push (killed + rerun): {push_time:.1?}; clone (killed + rerun): {:.1?}", started.elapsed());
}

/// Kills at random points, several in a row, then a rerun to the end: the object arrives
/// bit-exact both ways and no kill costs more than the parts in flight and the buffers.
#[test]
fn kills_at_random_points_resume_bit_exact() {
    let Some(rig) = Rig::start() else { return };
    let mut rng = Rng::new(42);
    let (dir, file, blob) = committed(&rig, 2, tensor_len() / 2);
    let mut carried = Vec::new();
    for _ in 0..2 {
        // Each run is killed after sending 10% to 40% of the object.
        let target = ((0.1 + rng.unit() * 0.3) * blob as f64) as u64;
        carried.push(rig.kill_at(dir.path(), &["push", "origin", "main"], Direction::Up, target));
    }
    carried.push(rig.run(dir.path(), &["push", "origin", "main"], Direction::Up));
    let fraction = resent(&carried, blob);
    eprintln!("push killed twice ({carried:?} bytes up): {:.2}% of the object sent twice", fraction * 100.0);
    assert!(fraction * blob as f64 <= 2.0 * KILL_COSTS_AT_MOST as f64, "{carried:?} of {blob}");
    assert!(rig.uploads_in_progress().is_empty());

    let parent = tempfile::tempdir().unwrap();
    let clone = ["clone", &rig.url(), "c"];
    let mut carried = Vec::new();
    for _ in 0..2 {
        let target = ((0.1 + rng.unit() * 0.3) * blob as f64) as u64;
        carried.push(rig.kill_at(parent.path(), &clone, Direction::Down, target));
    }
    carried.push(rig.run(parent.path(), &clone, Direction::Down));
    let fraction = resent(&carried, blob);
    eprintln!("clone killed twice ({carried:?} bytes down): {:.2}% of the object received twice", fraction * 100.0);
    assert!(fraction * blob as f64 <= 2.0 * KILL_COSTS_AT_MOST as f64, "{carried:?} of {blob}");
    assert!(std::fs::read(parent.path().join("c/model.safetensors")).unwrap() == file);
}

/// An upload the remote aborted (or that expired: its files on the server gone) while the
/// push was dead: the rerun starts over cleanly, leaves no upload behind, and the object
/// arrives whole.
#[test]
fn an_upload_aborted_or_expired_meanwhile_starts_over() {
    for (seed, how) in [(3, "aborted"), (4, "expired")] {
        let Some(rig) = Rig::start() else { return };
        let (dir, file, blob) = committed(&rig, seed, tensor_len() / 4);
        rig.kill_at(dir.path(), &["push", "origin", "main"], Direction::Up, blob / 2);
        let (_, state) = upload_state(dir.path());
        let upload_id = state["upload_id"].as_str().unwrap().to_string();
        assert!(!rig.uploads_in_progress().is_empty());
        if how == "aborted" {
            abort_upload(&rig, state["key"].as_str().unwrap(), &upload_id);
        } else {
            for name in rig.uploads_in_progress() {
                std::fs::remove_file(rig.server.root.path().join(name)).unwrap();
            }
        }
        assert!(rig.uploads_in_progress().is_empty());
        let rerun = rig.run(dir.path(), &["push", "origin", "main"], Direction::Up);
        assert!(rerun >= blob, "{how}: the rerun sent {rerun} bytes of {blob}: it cannot have resumed");
        assert!(transfers(dir.path(), "up-").is_empty(), "{how}: the upload state stays");
        assert!(rig.uploads_in_progress().is_empty(), "{how}: {:?}", rig.uploads_in_progress());
        clone_matches(&rig, &file);
    }
}

/// Aborts the multipart upload `upload_id` of `key` on the rig's server (as a lifecycle rule
/// or another tool would), straight, not through the proxy.
fn abort_upload(rig: &Rig, key: &str, upload_id: &str) {
    use object_store::multipart::MultipartStore;
    let s3 = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(BUCKET)
        .with_region("us-east-1")
        .with_endpoint(format!("http://127.0.0.1:{}", rig.server.port))
        .with_allow_http(true)
        .with_access_key_id(ACCESS_KEY)
        .with_secret_access_key(SECRET_KEY)
        .build()
        .unwrap();
    let location = object_store::path::Path::from(format!("{PREFIX}/{key}"));
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(s3.abort_multipart(&location, &upload_id.to_string())).unwrap();
}

/// A state file that is damaged or hostile (garbage, a huge file, an upload id that is a path,
/// ids and ETags of control characters, parts past the end, forged parts of an upload that does
/// not exist): the upload completes from scratch, bit-exact, without a panic, and the state is
/// removed. Through the library against the real server, one small object per case.
#[test]
fn a_damaged_or_hostile_upload_state_is_survived() {
    let Some(server) = S3Server::start() else { return };
    let options = ckpt::remote::S3Options {
        endpoint: Some(format!("http://127.0.0.1:{}", server.port)),
        region: Some("us-east-1".into()),
        allow_http: true,
    };
    let url = format!("s3://{BUCKET}/{PREFIX}");
    let transfers = tempfile::tempdir().unwrap();
    let data = noise(9, 21 << 20);
    let file_path = transfers.path().join("object");
    std::fs::write(&file_path, &data).unwrap();
    let part = PART as usize;
    let part_hash = |i: usize| blake3::hash(&data[i * part..(i + 1) * part]).to_hex().to_string();
    let state = |key: &str, upload_id: &str, parts: serde_json::Value| {
        serde_json::json!({"format": 1, "remote": url, "key": key, "len": data.len(), "part_size": PART,
            "upload_id": upload_id, "parts": parts})
        .to_string()
        .into_bytes()
    };
    let forged: Vec<serde_json::Value> = (0..3)
        .map(|i| serde_json::json!({"index": i, "size": PART, "etag": "\"forged\"", "blake3": part_hash(i)}))
        .collect();
    let too_many: Vec<serde_json::Value> = (0..10_001)
        .map(|i| serde_json::json!({"index": i, "size": PART, "etag": "e", "blake3": "0".repeat(64)}))
        .collect();
    let cases: Vec<(&str, StateFor)> = vec![
        ("garbage", Box::new(|_| b"\x00\xff\xfe not a state".to_vec())),
        ("empty", Box::new(|_| Vec::new())),
        ("huge", Box::new(|_| vec![b'{'; 5 << 20])),
        ("a path as upload id", Box::new(|key| state(key, "../../../etc/passwd", serde_json::json!([])))),
        ("control characters", Box::new(|key| state(key, "a\r\nX-Injected: 1", serde_json::json!([])))),
        ("a forged upload", Box::new(|key| state(key, "6f1c6b0e-0c7f-4d5e-9a43-1f0d2c3b4a59", forged.clone().into()))),
        ("parts past the end", Box::new(|key| state(key, "x", too_many.clone().into()))),
    ];
    for (i, (what, bytes)) in cases.iter().enumerate() {
        let key = format!("objects/{i:02x}/{}", "0".repeat(62));
        let mut remote = ckpt::remote::s3::StoreRemote::s3_with_credentials(&url, &options, ACCESS_KEY, SECRET_KEY)
            .unwrap()
            .with_part_size(PART as usize);
        use ckpt::remote::Remote;
        let dir = transfers.path().join("t");
        std::fs::create_dir_all(&dir).unwrap();
        remote.resume_uploads_in(&dir);
        // Written where the upload looks (it is gone afterwards only if the upload found it).
        std::fs::write(dir.join(state_name(&url, &key)), bytes(&key)).unwrap();
        let f = std::fs::File::open(&file_path).unwrap();
        let uploaded = remote.upload(&key, &f, &file_path, data.len() as u64, ckpt::remote::UploadMode::MayReplace);
        assert!(uploaded.is_ok(), "{what}: {uploaded:?}");
        let mut back = Vec::new();
        remote.download(&key, &mut back, u64::MAX).unwrap();
        assert!(back == data, "{what}: the object differs");
        let left = walk(&dir);
        assert!(left.is_empty(), "{what}: {left:?} left");
    }
}

/// A state file's bytes for a key.
type StateFor<'a> = Box<dyn Fn(&str) -> Vec<u8> + 'a>;

/// The name of the state file of an upload of `key` to `url` (docs/format.md, "Transfer
/// state"): `up-` and the first 32 hex digits of blake3(url, newline, key), `.json`.
fn state_name(url: &str, key: &str) -> String {
    let hash = blake3::hash(format!("{url}\n{key}").as_bytes()).to_hex();
    format!("up-{}.json", &hash[..32])
}
