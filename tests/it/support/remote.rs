//! Remotes under test: a directory, or a real S3-protocol server (`s3s-fs` on a loopback port,
//! started per test; skipped with a message when `s3s-fs` is not on PATH, a failure with
//! `CKPT_REQUIRE_S3S=1`), or a cloud emulator (Azurite, a GCS emulator: `super::clouds`).

use super::clouds::{self, Azurite, GcsEmulator, AZURITE_ACCOUNT, AZURITE_KEY};
use super::repo_util::{ckpt_command, stderr, synthetic_checkpoint, SMALL_MODEL};
use ckpt::Dtype;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// An `s3s-fs` server on a free loopback port with a temporary root; killed when dropped.
pub(crate) struct S3Server {
    child: Child,
    pub(crate) root: tempfile::TempDir,
    pub(crate) port: u16,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) const BUCKET: &str = "ckpt-test";
pub(crate) const ACCESS_KEY: &str = "ckpt-test-key";
pub(crate) const SECRET_KEY: &str = "ckpt-test-secret-do-not-print";

impl S3Server {
    /// Starts one, or `None` (with a message) when `s3s-fs` is not installed; with
    /// `CKPT_REQUIRE_S3S=1` (CI sets it) a missing `s3s-fs` fails the test instead.
    pub(crate) fn start() -> Option<S3Server> {
        if Command::new("s3s-fs").arg("--help").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
            super::skip(
                "s3s-fs is not on PATH (cargo install s3s-fs --version 0.14.1 --features binary)",
                "CKPT_REQUIRE_S3S",
            );
            return None;
        }
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join(BUCKET)).unwrap();
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let mut child = Command::new("s3s-fs")
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
                .arg(root.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start s3s-fs");
            for _ in 0..200 {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Some(S3Server { child, root, port });
                }
                if child.try_wait().unwrap().is_some() {
                    break; // the port was taken meanwhile: try another
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("s3s-fs did not start");
    }
}

/// A remote under test: its URL, the environment the `ckpt` processes need for it, and where
/// its object files are on disk (to damage one).
pub(crate) struct Served {
    pub(crate) url: String,
    pub(crate) env: Vec<(&'static str, String)>,
    /// Where its objects are on disk (an emulator's are not: a path that does not exist).
    pub(crate) objects: PathBuf,
    pub(crate) _dir: Option<tempfile::TempDir>,
    pub(crate) _server: Option<S3Server>,
    /// A cloud emulator serving it ([`Azurite`], [`GcsEmulator`]), kept until dropped.
    pub(crate) _cloud: Option<Box<dyn std::any::Any + Send + Sync>>,
}

pub(crate) fn directory() -> Option<Served> {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("remote");
    Some(Served {
        url: root.to_str().unwrap().to_string(),
        env: Vec::new(),
        objects: root.join("objects"),
        _dir: Some(dir),
        _server: None,
        _cloud: None,
    })
}

pub(crate) fn s3() -> Option<Served> {
    let server = S3Server::start()?;
    let env = vec![
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
        ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{}", server.port)),
        ("AWS_ALLOW_HTTP", "true".to_string()),
    ];
    Some(Served {
        url: format!("s3://{BUCKET}/team/run1"),
        env,
        objects: server.root.path().join(BUCKET).join("team/run1/objects"),
        _dir: None,
        _server: Some(server),
        _cloud: None,
    })
}

/// An Azure remote on Azurite, reached as Azure's tools reach it: `AZURE_STORAGE_USE_EMULATOR`
/// and `AZURITE_BLOB_STORAGE_URL` (the well-known development account and key).
pub(crate) fn azurite() -> Option<Served> {
    let azurite = Azurite::start()?;
    let env = vec![
        ("AZURE_STORAGE_USE_EMULATOR", "true".to_string()),
        ("AZURITE_BLOB_STORAGE_URL", format!("http://127.0.0.1:{}", azurite.port)),
    ];
    Some(Served {
        url: format!("az://{}/team/run1", clouds::BUCKET),
        env,
        objects: PathBuf::from("/nonexistent/azurite/objects"),
        _dir: None,
        _server: None,
        _cloud: Some(Box::new(azurite)),
    })
}

/// A Google Cloud Storage remote on the emulator, reached as Google's tools reach one:
/// `STORAGE_EMULATOR_HOST`, no credentials.
pub(crate) fn gcs() -> Option<Served> {
    let gcs = GcsEmulator::start()?;
    Some(Served {
        url: format!("gs://{}/team/run1", clouds::BUCKET),
        env: vec![("STORAGE_EMULATOR_HOST", gcs.host())],
        objects: PathBuf::from("/nonexistent/gcs/objects"),
        _dir: None,
        _server: None,
        _cloud: Some(Box::new(gcs)),
    })
}

impl Served {
    /// Runs `ckpt` in `dir` with the remote's environment.
    pub(crate) fn ckpt(&self, dir: &Path, args: &[&str]) -> Output {
        let mut c = ckpt_command(dir, args);
        for (k, v) in &self.env {
            c.env(k, v);
        }
        let out = c.output().expect("run ckpt");
        for secret in [SECRET_KEY, AZURITE_KEY] {
            assert!(
                !String::from_utf8_lossy(&out.stdout).contains(secret) && !stderr(&out).contains(secret),
                "a secret was printed"
            );
        }
        out
    }

    pub(crate) fn ok(&self, dir: &Path, args: &[&str]) -> Output {
        let out = self.ckpt(dir, args);
        assert!(out.status.success(), "ckpt {args:?} failed: {}", stderr(&out));
        out
    }
}

pub(crate) fn model(seed: u64, epoch: u32) -> Vec<u8> {
    synthetic_checkpoint(seed, Dtype::Bf16, SMALL_MODEL, epoch)
}

/// A new working tree with a repository and `epochs` commits of `model.safetensors`.
pub(crate) fn trained(r: &Served, seed: u64, epochs: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    r.ok(dir.path(), &["init"]);
    for e in 0..epochs {
        std::fs::write(dir.path().join("model.safetensors"), model(seed, e)).unwrap();
        r.ok(dir.path(), &["commit", "-m", &format!("epoch {e}"), "model.safetensors"]);
    }
    dir
}

pub(crate) fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).expect("json output")
}

/// A directory remote that records what the code under test asks of it: the keys downloaded
/// with the bytes each delivered, the keys uploaded, the prefixes listed; while
/// `fail_recodes` is set, replacing an object fails (a save stopped in its mirror recodes).
pub struct Recording {
    pub inner: ckpt::remote::local::DirRemote,
    pub downloads: std::sync::Mutex<Vec<(String, u64)>>,
    pub uploads: std::sync::Mutex<Vec<String>>,
    pub lists: std::sync::Mutex<Vec<String>>,
    pub fail_recodes: std::sync::atomic::AtomicBool,
}

impl Recording {
    /// A new directory remote at `url`, recorded.
    pub fn create(url: &str) -> Recording {
        Recording {
            inner: ckpt::remote::local::DirRemote::create(url).unwrap(),
            downloads: Default::default(),
            uploads: Default::default(),
            lists: Default::default(),
            fail_recodes: Default::default(),
        }
    }

    /// The downloads recorded so far (key, bytes), forgotten.
    pub fn take_downloads(&self) -> Vec<(String, u64)> {
        std::mem::take(&mut *self.downloads.lock().unwrap())
    }

    /// The keys downloaded so far.
    pub fn downloaded_keys(&self) -> Vec<String> {
        self.downloads.lock().unwrap().iter().map(|(k, _)| k.clone()).collect()
    }
}

/// A `Write` that counts what it accepts (the count is `.1`).
pub(crate) struct Counting<'a>(pub(crate) &'a mut dyn std::io::Write, pub(crate) u64);

impl std::io::Write for Counting<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.0.write(buf)?;
        self.1 += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl ckpt::remote::Remote for Recording {
    fn url(&self) -> &str {
        self.inner.url()
    }
    fn list(&self, prefix: &str) -> ckpt::remote::Result<Vec<String>> {
        self.lists.lock().unwrap().push(prefix.to_string());
        self.inner.list(prefix)
    }
    fn list_modified(&self, prefix: &str) -> ckpt::remote::Result<Vec<ckpt::remote::Listed>> {
        self.lists.lock().unwrap().push(prefix.to_string());
        self.inner.list_modified(prefix)
    }
    fn modified(&self, key: &str) -> ckpt::remote::Result<Option<std::time::SystemTime>> {
        self.inner.modified(key)
    }
    fn get_small(&self, key: &str) -> ckpt::remote::Result<Option<ckpt::remote::Small>> {
        self.inner.get_small(key)
    }
    fn put_small(&self, key: &str, bytes: &[u8], expect: &ckpt::remote::Expect) -> ckpt::remote::Result<()> {
        self.inner.put_small(key, bytes, expect)
    }
    fn upload(
        &self,
        key: &str,
        file: &std::fs::File,
        path: &Path,
        len: u64,
        mode: ckpt::remote::UploadMode,
    ) -> ckpt::remote::Result<ckpt::remote::Uploaded> {
        self.uploads.lock().unwrap().push(key.to_string());
        self.inner.upload(key, file, path, len, mode)
    }
    fn replace(&self, key: &str, file: &std::fs::File, path: &Path, len: u64) -> ckpt::remote::Result<()> {
        if key.starts_with("objects/") && self.fail_recodes.load(std::sync::atomic::Ordering::Relaxed) {
            let source = std::io::Error::other("the save was killed");
            let remote = self.url().into();
            return Err(ckpt::remote::Error::Io { remote, action: "replacing", path: key.into(), source });
        }
        self.inner.replace(key, file, path, len)
    }
    fn delete(&self, key: &str) -> ckpt::remote::Result<()> {
        self.inner.delete(key)
    }
    fn read_head(&self, key: &str, len: u64) -> ckpt::remote::Result<(Vec<u8>, u64)> {
        self.inner.read_head(key, len)
    }
    fn download(&self, key: &str, out: &mut dyn std::io::Write, limit: u64) -> ckpt::remote::Result<u64> {
        let mut counted = Counting(out, 0);
        let done = self.inner.download(key, &mut counted, limit);
        self.downloads.lock().unwrap().push((key.to_string(), counted.1));
        done
    }
    fn requests(&self) -> u64 {
        self.inner.requests()
    }
}

/// A remote whose object replacements fail (a mirror push killed after its ref moved, before
/// its recodes): journals and refs are written as usual.
pub struct NoRecodes(pub Box<dyn ckpt::remote::Remote>);

impl ckpt::remote::Remote for NoRecodes {
    fn url(&self) -> &str {
        self.0.url()
    }
    fn list(&self, prefix: &str) -> ckpt::remote::Result<Vec<String>> {
        self.0.list(prefix)
    }
    fn list_modified(&self, prefix: &str) -> ckpt::remote::Result<Vec<ckpt::remote::Listed>> {
        self.0.list_modified(prefix)
    }
    fn modified(&self, key: &str) -> ckpt::remote::Result<Option<std::time::SystemTime>> {
        self.0.modified(key)
    }
    fn get_small(&self, key: &str) -> ckpt::remote::Result<Option<ckpt::remote::Small>> {
        self.0.get_small(key)
    }
    fn put_small(&self, key: &str, bytes: &[u8], expect: &ckpt::remote::Expect) -> ckpt::remote::Result<()> {
        self.0.put_small(key, bytes, expect)
    }
    fn upload(
        &self,
        key: &str,
        file: &std::fs::File,
        path: &Path,
        len: u64,
        mode: ckpt::remote::UploadMode,
    ) -> ckpt::remote::Result<ckpt::remote::Uploaded> {
        self.0.upload(key, file, path, len, mode)
    }
    fn replace(&self, key: &str, file: &std::fs::File, path: &Path, len: u64) -> ckpt::remote::Result<()> {
        if key.starts_with("objects/") {
            return Err(ckpt::remote::Error::NotFound { remote: "killed".into(), key: key.into() });
        }
        self.0.replace(key, file, path, len)
    }
    fn delete(&self, key: &str) -> ckpt::remote::Result<()> {
        self.0.delete(key)
    }
    fn read_head(&self, key: &str, len: u64) -> ckpt::remote::Result<(Vec<u8>, u64)> {
        self.0.read_head(key, len)
    }
    fn download(&self, key: &str, out: &mut dyn std::io::Write, limit: u64) -> ckpt::remote::Result<u64> {
        self.0.download(key, out, limit)
    }
    fn requests(&self) -> u64 {
        self.0.requests()
    }
}

/// A fresh clone of the remote reads every version as `expected` says, and verifies.
pub(crate) fn clone_reads(r: &Served, expected: &[(&str, Vec<u8>)]) {
    let parent = tempfile::tempdir().unwrap();
    r.ok(parent.path(), &["clone", &r.url, "c"]);
    let c = parent.path().join("c");
    r.ok(&c, &["verify"]);
    for (rev, bytes) in expected {
        let out = tempfile::tempdir().unwrap();
        r.ok(&c, &["checkout", rev, "--output", out.path().to_str().unwrap()]);
        assert_eq!(&std::fs::read(out.path().join("model.safetensors")).unwrap(), bytes, "{rev}");
    }
}

/// The remote `r` on Azurite opened in this process, with the account and key passed in and
/// its blob service URL as the endpoint (what `--endpoint` does); `None` for another remote.
pub(crate) fn azure_client(r: &Served) -> Option<ckpt::remote::s3::StoreRemote> {
    let azurite = r.env.iter().find(|(key, _)| *key == "AZURITE_BLOB_STORAGE_URL")?;
    let endpoint = Some(format!("{}/{AZURITE_ACCOUNT}", azurite.1));
    let options = ckpt::remote::S3Options { endpoint, allow_http: true, ..Default::default() };
    Some(ckpt::remote::s3::StoreRemote::azure_with_key(&r.url, &options, AZURITE_ACCOUNT, AZURITE_KEY).unwrap())
}

/// The remote `r` opened in this process (with settings, not the environment: tests run as
/// threads of one process).
pub(crate) fn open_remote(r: &Served) -> Box<dyn ckpt::remote::Remote> {
    use ckpt::remote::s3::StoreRemote;
    let env = |k: &str| r.env.iter().find(|(key, _)| *key == k).map(|(_, v)| v.clone());
    if let Some(azure) = azure_client(r) {
        return Box::new(azure);
    }
    if let Some(host) = env("STORAGE_EMULATOR_HOST") {
        return Box::new(StoreRemote::gcs_emulator(&r.url, &host).unwrap());
    }
    match env("AWS_ENDPOINT_URL") {
        None => Box::new(ckpt::remote::local::DirRemote::open(&r.url).unwrap()),
        Some(endpoint) => {
            let options = ckpt::remote::S3Options {
                endpoint: Some(endpoint),
                region: Some("us-east-1".into()),
                allow_http: true,
            };
            Box::new(
                ckpt::remote::s3::StoreRemote::s3_with_credentials(&r.url, &options, ACCESS_KEY, SECRET_KEY).unwrap(),
            )
        }
    }
}

/// Each named test of a remote module, run against a directory remote (`directory`) and
/// against S3 (`s3s_fs`, which skips without the server unless `CKPT_REQUIRE_S3S` is set);
/// those named after `clouds:` also against Azurite (`azurite`) and the GCS emulator
/// (`gcs_emulator`), which skip without them unless `CKPT_REQUIRE_AZURITE` /
/// `CKPT_REQUIRE_GCS_EMULATOR` is set. (A test that damages or ages object files on disk runs
/// on the first two only: an emulator's objects are not files.)
macro_rules! remote_suite {
    ($($test:ident),*) => {
        mod directory {
            $(#[test] fn $test() { super::$test(&super::directory().unwrap()) })*
        }
        mod s3s_fs {
            $(#[test] fn $test() { if let Some(r) = super::s3() { super::$test(&r) } })*
        }
    };
    ($($test:ident),* ; clouds: $($cloud:ident),*) => {
        $crate::support::remote::remote_suite!($($test),*);
        mod azurite {
            $(#[test] fn $cloud() {
                if let Some(r) = $crate::support::remote::azurite() { super::$cloud(&r) }
            })*
        }
        mod gcs_emulator {
            $(#[test] fn $cloud() {
                if let Some(r) = $crate::support::remote::gcs() { super::$cloud(&r) }
            })*
        }
    };
}
pub(crate) use remote_suite;
