//! Remotes and hostile input, round 2 (issue #39): credentials in the S3 endpoint are refused
//! or masked in every message, an object longer than its header says is cut off where the
//! header says it ends, and a directory remote's pipes, sockets, links, directories and stalls
//! are errors naming them instead of waits without end or refs that silently are not there.

use crate::support::proxy::Proxy;
use crate::support::remote::{directory, model, s3, trained, Recording, Served};
use crate::support::repo_util::{ckpt_command, ckpt_in, output_within, stderr};
use ckpt::store::{ObjectHeader, ObjectKind};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

/// A secret the tests put where credentials do not belong; never printed.
const SECRET: &str = "SeCrEt-in-a-url";

/// The object file of `hex` under a remote's `objects/`.
fn object_file(objects: &Path, hex: &str) -> PathBuf {
    objects.join(&hex[..2]).join(&hex[2..])
}

/// A repository with two epochs of `model.safetensors` on `main` pushed to `r`: the working
/// tree, and the ids of main's version, its manifest and a blob of it (hex).
fn pushed(r: &Served, seed: u64) -> (tempfile::TempDir, [String; 3]) {
    let a = trained(r, seed, 2);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    let repo = ckpt::repo::Repo::open(a.path()).unwrap();
    let head = std::fs::read_to_string(a.path().join(".ckpt/refs/heads/main")).unwrap().trim().to_string();
    let version = repo.version(&head.parse().unwrap()).unwrap();
    let manifest = version.files[0].manifest;
    let blob = repo.manifest(&manifest).unwrap().blobs().next().unwrap();
    drop(repo);
    (a, [head, manifest.to_hex(), blob.to_hex()])
}

/// `ckpt ARGS` in `dir` with `r`'s environment and `extra`, killed after `limit` (`None`).
fn ckpt_within(r: &Served, dir: &Path, args: &[&str], extra: &[(&str, &str)], limit: Duration) -> Option<Output> {
    let mut c = ckpt_command(dir, args);
    for (k, v) in &r.env {
        c.env(k, v);
    }
    for (k, v) in extra {
        c.env(k, v);
    }
    output_within(c, limit)
}

/// Files (not directories) under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

// ---- item 6: credentials in the endpoint ----------------------------------------------------

/// Item 6: an endpoint in the environment with user information or a query string is refused,
/// as `remote add --endpoint` refuses one, and the secret is printed nowhere.
#[test]
fn an_environment_endpoint_with_credentials_is_refused_and_never_printed() {
    let Some(r) = s3() else { return };
    let (a, _) = pushed(&r, 1);
    let port = r.env.iter().find(|(k, _)| *k == "AWS_ENDPOINT_URL").unwrap().1.rsplit(':').next().unwrap().to_string();
    let parent = tempfile::tempdir().unwrap();
    for (variable, endpoint) in [
        ("AWS_ENDPOINT_URL", format!("http://user:{SECRET}@127.0.0.1:{port}")),
        ("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}/?X-Amz-Security-Token={SECRET}")),
        ("AWS_ENDPOINT_URL_S3", format!("http://user:{SECRET}@127.0.0.1:{port}")),
    ] {
        for (dir, args) in
            [(parent.path(), vec!["clone", &r.url, "b"]), (a.path(), vec!["fetch"]), (a.path(), vec!["push"])]
        {
            let env = [(variable, endpoint.as_str()), ("CKPT_REMOTE_TIMEOUT", "0.5")];
            let out = ckpt_within(&r, dir, &args, &env, Duration::from_secs(60)).expect("ckpt ended");
            let err = stderr(&out);
            assert!(!out.status.success(), "{variable}={endpoint}: ckpt {args:?} succeeded");
            assert!(!err.contains(SECRET) && !String::from_utf8_lossy(&out.stdout).contains(SECRET), "printed: {err}");
            assert!(err.contains(variable) && err.contains("AWS_ACCESS_KEY_ID"), "says what to do: {err}");
        }
        assert!(!parent.path().join("b").exists(), "a refused clone leaves nothing behind");
    }
}

/// Item 6: an endpoint with credentials stored by an older ckpt still works as it did, but
/// its secret is masked in the object store's own errors too (the request URL they quote);
/// a remote URL with a query string, which would reach the server inside key names, is refused.
#[test]
fn credentials_in_an_old_remotes_entry_are_masked_in_every_layer() {
    let Some(r) = s3() else { return };
    let (a, _) = pushed(&r, 2);
    let port = r.env.iter().find(|(k, _)| *k == "AWS_ENDPOINT_URL").unwrap().1.rsplit(':').next().unwrap().to_string();
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let entries = [
        // The server answers (404: no such bucket), quoting the request URL.
        format!(r#"{{"url":"s3://no-such-bucket/x","s3":{{"endpoint":"http://user:{SECRET}@127.0.0.1:{port}"}}}}"#),
        // Nothing answers: the connection error quotes the request URL.
        format!(r#"{{"url":"{}","s3":{{"endpoint":"http://user:{SECRET}@127.0.0.1:{dead}?token={SECRET}"}}}}"#, r.url),
        format!(r#"{{"url":"{}?token={SECRET}"}}"#, r.url),
    ];
    for entry in entries {
        std::fs::write(a.path().join(".ckpt/remotes"), format!(r#"{{"origin":{entry}}}"#)).unwrap();
        for args in [&["fetch"][..], &["push"], &["gc", "--remote", "origin", "--dry-run"], &["remote", "-v"]] {
            let out = ckpt_within(&r, a.path(), args, &[("CKPT_REMOTE_TIMEOUT", "0.3")], Duration::from_secs(60))
                .expect("ckpt ended");
            let (err, text) = (stderr(&out), String::from_utf8_lossy(&out.stdout).into_owned());
            assert!(!err.contains(SECRET) && !text.contains(SECRET), "{entry}: ckpt {args:?} printed it: {err}{text}");
            if args[0] != "remote" {
                assert!(!out.status.success(), "{entry}: ckpt {args:?} succeeded");
                assert!(err.contains("***"), "{entry}: the URL is shown masked: {err}");
            }
        }
    }
}

// ---- item 7: objects longer than their header says ------------------------------------------

/// Pads the file `path` to `by` bytes more than it holds (sparse: costs no disk).
fn pad(path: &Path, by: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len + by).unwrap();
}

/// Replaces the object file `path` by a header of `kind` claiming `raw_len` bytes, padded.
fn forge_header(path: &Path, id: &str, kind: ObjectKind, raw_len: u64, padding: u64) {
    let header = ObjectHeader { kind, dtype: None, reference: None, depth: 0, conversion: None, raw_len };
    let bytes = header.encode();
    ObjectHeader::decode(id.parse().unwrap(), &bytes).unwrap();
    std::fs::remove_file(path).unwrap();
    std::fs::write(path, bytes).unwrap();
    pad(path, padding);
}

const PADDING: u64 = 1 << 30;

/// The damaged objects of item 7, by name: for each, the object's hex id (of `ids`) and how
/// it is damaged.
fn damage(objects: &Path, ids: &[String; 3], case: &str) -> String {
    let [version, manifest, blob] = ids;
    let (hex, len) = match case {
        "version padded" => (version, None),
        "manifest padded" => (manifest, None),
        "blob padded" => (blob, None),
        "version claiming a terabyte" => (version, Some(1u64 << 40)),
        _ => unreachable!(),
    };
    let path = object_file(objects, hex);
    match len {
        None => pad(&path, PADDING),
        Some(raw_len) => forge_header(&path, hex, ObjectKind::Version, raw_len, PADDING),
    }
    hex.clone()
}

const CASES: [&str; 4] = ["version padded", "manifest padded", "blob padded", "version claiming a terabyte"];

/// Item 7, directory remote: an object padded by a gigabyte behind its container (or whose
/// header claims more than the store reads) is refused once what its header allows has
/// arrived, nothing of it stays in `.ckpt/incoming`, and nothing bad is stored.
#[test]
fn an_object_longer_than_its_header_says_is_cut_off_directory() {
    for case in CASES {
        let r = directory().unwrap();
        let (_a, ids) = pushed(&r, 3);
        let original = std::fs::metadata(object_file(&r.objects, &ids[0])).unwrap().len().max(
            std::fs::metadata(object_file(&r.objects, &ids[1]))
                .unwrap()
                .len()
                .max(std::fs::metadata(object_file(&r.objects, &ids[2])).unwrap().len()),
        );
        let hex = damage(&r.objects, &ids, case);

        let b = tempfile::tempdir().unwrap();
        assert!(ckpt_in(b.path(), &["init"]).status.success());
        let repo = ckpt::repo::Repo::open(b.path()).unwrap();
        let remote = Recording::create(&r.url);
        let err = ckpt::sync::fetch_from(&repo, &remote, "origin", 4).unwrap_err().to_string();
        let key = format!("objects/{}/{}", &hex[..2], &hex[2..]);
        let taken: u64 = remote.take_downloads().iter().filter(|(k, _)| *k == key).map(|(_, n)| n).sum();
        assert!(taken <= 2 * original + (2 << 20), "{case}: {taken} bytes of {key} were taken");
        assert!(err.contains(&hex), "{case}: the error names the object: {err}");
        assert!(err.contains("longer") || err.contains("at most"), "{case}: says why: {err}");
        assert!(files_under(&b.path().join(".ckpt/incoming")).is_empty(), "{case}: staging is cleaned up");
        drop(repo);
        let verify = ckpt_in(b.path(), &["verify"]);
        assert!(verify.status.success(), "{case}: nothing bad was stored: {}", stderr(&verify));
    }
}

/// Item 7, S3 (through a proxy that counts what comes down): the same objects are refused
/// after what their header allows, not downloaded whole; a failed clone leaves nothing, a
/// failed fetch leaves nothing in `.ckpt/incoming`.
#[test]
fn an_object_longer_than_its_header_says_is_cut_off_s3() {
    for case in CASES {
        let Some(r) = s3() else { return };
        let (_a, ids) = pushed(&r, 4);
        let hex = damage(&r.objects, &ids, case);
        let port: u16 = r
            .env
            .iter()
            .find(|(k, _)| *k == "AWS_ENDPOINT_URL")
            .unwrap()
            .1
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let proxy = Proxy::start(port);
        let endpoint = proxy.endpoint();
        let env = [("AWS_ENDPOINT_URL", endpoint.as_str())];

        let parent = tempfile::tempdir().unwrap();
        let out = ckpt_within(&r, parent.path(), &["clone", &r.url, "b"], &env, Duration::from_secs(120)).unwrap();
        let err = stderr(&out);
        assert!(proxy.bytes_down() < 64 << 20, "{case}: {} bytes came down", proxy.bytes_down());
        assert!(!out.status.success(), "{case}: the clone succeeded");
        assert!(err.contains(&hex) && (err.contains("longer") || err.contains("at most")), "{case}: {err}");
        assert!(!parent.path().join("b").exists(), "{case}: a failed clone leaves nothing behind");

        let b = tempfile::tempdir().unwrap();
        r.ok(b.path(), &["init"]);
        r.ok(b.path(), &["remote", "add", "origin", &r.url]);
        let out = ckpt_within(&r, b.path(), &["fetch"], &env, Duration::from_secs(120)).unwrap();
        assert!(!out.status.success(), "{case}: the fetch succeeded");
        assert!(proxy.bytes_down() < 128 << 20, "{case}: {} bytes came down", proxy.bytes_down());
        assert!(files_under(&b.path().join(".ckpt/incoming")).is_empty(), "{case}: staging is cleaned up");
        r.ok(b.path(), &["verify"]);
    }
}

// ---- item 8: what is not a regular file in a directory remote -------------------------------

/// Makes `path` (removed first) a named pipe.
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

/// Replaces the file `path` by `what`: a named pipe, a socket, a link to `/dev/zero`, a link to
/// a copy of itself, an empty directory or a directory holding a copy of it. Returns what must
/// stay alive meanwhile (a socket's listener).
fn replace_by(path: &Path, what: &str) -> Option<std::os::unix::net::UnixListener> {
    let bytes = std::fs::read(path).unwrap();
    std::fs::remove_file(path).unwrap();
    match what {
        "pipe" => mkfifo(path),
        "socket" => return Some(std::os::unix::net::UnixListener::bind(path).unwrap()),
        "link to /dev/zero" => std::os::unix::fs::symlink("/dev/zero", path).unwrap(),
        "link to a copy" => {
            let copy = path.with_extension("copy");
            std::fs::write(&copy, bytes).unwrap();
            std::os::unix::fs::symlink(&copy, path).unwrap();
        }
        "empty directory" => std::fs::create_dir(path).unwrap(),
        "directory" => {
            std::fs::create_dir(path).unwrap();
            std::fs::write(path.join("x"), bytes).unwrap();
        }
        _ => unreachable!(),
    }
    None
}

/// The words of the error for each kind of entry.
fn named(what: &str) -> &'static str {
    match what {
        "pipe" => "named pipe",
        "socket" => "socket",
        "link to /dev/zero" | "link to a copy" => "symbolic link",
        _ => "directory",
    }
}

/// Item 8: an object of a directory remote that is a pipe, a socket, a link or a directory
/// makes `clone` fail at once with an error naming it (a pipe used to block it forever, a link
/// to `/dev/zero` to fill the disk).
#[test]
fn an_object_that_is_not_a_regular_file_is_refused_without_waiting() {
    for what in ["pipe", "socket", "link to /dev/zero", "empty directory"] {
        let r = directory().unwrap();
        let (_a, ids) = pushed(&r, 5);
        let _keep = replace_by(&object_file(&r.objects, &ids[2]), what);
        let parent = tempfile::tempdir().unwrap();
        let out = ckpt_within(&r, parent.path(), &["clone", &r.url, "b"], &[], Duration::from_secs(60))
            .unwrap_or_else(|| panic!("{what}: the clone did not end"));
        let err = stderr(&out);
        assert!(!out.status.success(), "{what}: the clone succeeded");
        assert!(err.contains(&ids[2][2..]) && err.contains(named(what)), "{what}: {err}");
        assert!(!parent.path().join("b").exists(), "{what}: a failed clone leaves nothing behind");
    }
}

/// Item 8: a remote branch whose ref is a directory, a link or a pipe is an error naming it in
/// `clone` (which left it out and succeeded), `fetch` (which kept the old remote-tracking ref)
/// and `gc --remote` (which deleted what only it reaches), never a branch that is not there.
#[test]
fn a_remote_ref_that_is_not_a_regular_file_is_an_error_naming_it() {
    for what in ["empty directory", "directory", "link to a copy", "pipe"] {
        let r = directory().unwrap();
        let a = trained(&r, 6, 1);
        r.ok(a.path(), &["remote", "add", "origin", &r.url]);
        r.ok(a.path(), &["branch", "side"]);
        r.ok(a.path(), &["switch", "side"]);
        std::fs::write(a.path().join("model.safetensors"), model(60, 0)).unwrap();
        r.ok(a.path(), &["commit", "-m", "side", "model.safetensors"]);
        r.ok(a.path(), &["push", "origin", "side"]);
        r.ok(a.path(), &["switch", "main"]);
        r.ok(a.path(), &["push", "origin", "main"]);
        let parent = tempfile::tempdir().unwrap();
        r.ok(parent.path(), &["clone", &r.url, "b"]);
        let b = parent.path().join("b");
        let objects_before = files_under(&r.objects);

        let ref_file = Path::new(&r.url).join("refs/heads/side");
        let _keep = replace_by(&ref_file, what);
        let runs: [(&Path, &[&str]); 3] = [
            (parent.path(), &["clone", &r.url, "c"]),
            (&b, &["fetch"]),
            (&b, &["gc", "--remote", "origin", "--prune=now"]),
        ];
        for (dir, args) in runs {
            let out = ckpt_within(&r, dir, args, &[], Duration::from_secs(60))
                .unwrap_or_else(|| panic!("{what}: ckpt {args:?} did not end"));
            let err = stderr(&out);
            assert!(!out.status.success(), "{what}: ckpt {args:?} succeeded");
            assert!(err.contains("refs/heads/side"), "{what}: ckpt {args:?} names the ref: {err}");
        }
        assert!(!parent.path().join("c").exists(), "{what}: a failed clone leaves nothing behind");
        assert_eq!(files_under(&r.objects), objects_before, "{what}: gc deleted objects");
    }
}

/// Item 8, S3: a branch that is a key prefix (`refs/heads/side/x`, no `refs/heads/side`) is an
/// error naming it in `clone` and `fetch`, not a branch that is not there.
#[test]
fn a_remote_ref_that_is_a_key_prefix_is_an_error_naming_it_s3() {
    let Some(r) = s3() else { return };
    let a = trained(&r, 7, 1);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["branch", "side"]);
    r.ok(a.path(), &["push", "origin", "main", "side"]);
    let parent = tempfile::tempdir().unwrap();
    r.ok(parent.path(), &["clone", &r.url, "b"]);
    // s3s-fs keeps each key as a file under its root.
    let refs = r.objects.parent().unwrap().join("refs/heads");
    let _ = replace_by(&refs.join("side"), "directory");
    for (dir, args) in [(parent.path(), &["clone", &r.url, "c"][..]), (&parent.path().join("b"), &["fetch"])] {
        let out = r.ckpt(dir, args);
        let err = stderr(&out);
        assert!(!out.status.success(), "ckpt {args:?} succeeded");
        assert!(err.contains("refs/heads/side") && err.contains("directory"), "ckpt {args:?}: {err}");
    }
    assert!(!parent.path().join("c").exists());
}

/// Item 8: `CKPT_REMOTE_TIMEOUT` bounds a read of a directory remote as it bounds an S3
/// request: a ref another process holds a write lease on (the kernel makes its readers wait up
/// to `lease-break-time`, 45 s) costs the timeout, and the error names the ref and the
/// setting.
#[test]
fn the_stall_timeout_bounds_a_directory_remote_read() {
    let r = directory().unwrap();
    let _a = trained(&r, 8, 1);
    r.ok(_a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(_a.path(), &["push"]);
    let ref_file = Path::new(&r.url).join("refs/heads/main");
    // A write lease needs the only open descriptor of the file, for writing.
    let held = std::fs::OpenOptions::new().write(true).open(&ref_file).unwrap();
    use std::os::fd::AsRawFd;
    /// `fcntl`'s `F_SETSIG` (Linux; not in the `libc` crate).
    const F_SETSIG: libc::c_int = 10;
    // SAFETY: plain fcntl calls on a descriptor this test owns. The lease break is announced
    // with SIGURG, which is ignored unless handled, instead of SIGIO, which would end the test.
    let leased = unsafe {
        libc::fcntl(held.as_raw_fd(), F_SETSIG, libc::SIGURG) == 0
            && libc::fcntl(held.as_raw_fd(), libc::F_SETLEASE, libc::F_WRLCK) == 0
    };
    if !leased {
        crate::support::skip(
            &format!("no file lease here: {}", std::io::Error::last_os_error()),
            "CKPT_REQUIRE_LEASES",
        );
        return;
    }
    let parent = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let out = ckpt_within(
        &r,
        parent.path(),
        &["clone", &r.url, "b"],
        &[("CKPT_REMOTE_TIMEOUT", "1")],
        Duration::from_secs(20),
    )
    .expect("the clone waited for the lease");
    drop(held);
    let err = stderr(&out);
    assert!(!out.status.success(), "the clone succeeded");
    assert!(err.contains("refs/heads/main") && err.contains("CKPT_REMOTE_TIMEOUT"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
}

/// Item 8: a push waits for the lock of a directory remote's refs (`refs.lock`, held by another
/// pusher for a read and a rename) at most the stall timeout, not forever.
#[test]
fn a_push_waits_for_a_directory_remote_s_ref_lock_at_most_the_stall_timeout() {
    let r = directory().unwrap();
    let a = trained(&r, 9, 1);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    let lock = std::fs::File::create(Path::new(&r.url).join("refs.lock")).unwrap();
    lock.lock().unwrap();
    let out = ckpt_within(&r, a.path(), &["push"], &[("CKPT_REMOTE_TIMEOUT", "1")], Duration::from_secs(30))
        .expect("the push waited for the lock without end");
    let err = stderr(&out);
    assert!(!out.status.success(), "the push succeeded");
    assert!(err.contains("refs.lock") && err.contains("CKPT_REMOTE_TIMEOUT"), "{err}");
    drop(lock);
    r.ok(a.path(), &["push"]);
}
