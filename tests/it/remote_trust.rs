//! Remotes and hostile input (issue #24): what a remote sends is bounded before it is
//! decoded, a push does not trust that the remote's ref is complete, a fetch does not hold the
//! writer lock while it waits on the network, URLs never keep or show credentials, and a clone
//! leaves nothing behind when it fails, nor goes where its URL's last component points.

use crate::support::proxy::{Direction, Fault, Proxy};
use crate::support::remote::{directory, json, model, s3, trained};
use crate::support::repo_util::{ckpt_command, ckpt_in, stderr};
use ckpt::store::{ObjectKind, Store};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Runs `ckpt ARGS` in `dir` under `/usr/bin/time`: its output and its peak resident set in
/// bytes (`None` where `/usr/bin/time` is missing).
fn ckpt_measured(dir: &Path, args: &[&str]) -> (Output, Option<u64>) {
    if !Path::new("/usr/bin/time").exists() {
        return (ckpt_in(dir, args), None);
    }
    let out = Command::new("/usr/bin/time")
        .arg("-f")
        .arg("maxrss-kib=%M")
        .arg(env!("CARGO_BIN_EXE_ckpt"))
        .args(args)
        .current_dir(dir)
        .env("CKPT_COMPACT", "inline")
        .output()
        .expect("run ckpt under /usr/bin/time");
    let err = stderr(&out);
    let kib = err.lines().rev().find_map(|l| l.strip_prefix("maxrss-kib=")).and_then(|v| v.trim().parse::<u64>().ok());
    (out, kib.map(|k| k * 1024))
}

/// A directory remote whose `main` names a version of one file whose manifest is a
/// decompression bomb: `segments` segments of JSON that code to a few hundred KiB.
fn hostile_remote(segments: usize) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("evil");
    let store = Store::init(&root).unwrap();
    let blob = "ab".repeat(32);
    let mut manifest = String::with_capacity(segments * 90 + 200);
    manifest.push_str(&format!(r#"{{"format":2,"kind":"bytes","len":{segments},"hash":"{blob}","segments":["#));
    for i in 0..segments {
        if i > 0 {
            manifest.push(',');
        }
        manifest.push_str(r#"{"len":1,"blob":""#);
        manifest.push_str(&blob);
        manifest.push_str(r#""}"#);
    }
    manifest.push_str("]}");
    let options = ckpt::codec::Options { chunk_size: 4 << 20, ..Default::default() };
    let m = store.write_data(ObjectKind::Manifest, manifest.as_bytes(), &options).unwrap();
    drop(manifest);
    let version = format!(
        r#"{{"format":2,"parents":[],"time":1,"message":"evil","since_base":0,"files":[{{"path":"model.safetensors","manifest":"{}","len":{segments},"hash":"{blob}"}}],"raw_bytes":{segments},"stored_bytes":1}}"#,
        m.id.to_hex()
    );
    let v = store.write_data(ObjectKind::Version, version.as_bytes(), &options).unwrap();
    std::fs::create_dir_all(root.join("refs/heads")).unwrap();
    std::fs::write(root.join("refs/heads/main"), format!("{}\n", v.id.to_hex())).unwrap();
    (dir, root)
}

/// Item 1: a manifest that decodes to more JSON than any file needs is refused from its
/// object header, before it is decoded: `clone` and `fetch` fail with a message naming the
/// cap, in bounded memory, and the failed clone leaves no directory behind.
#[test]
fn a_manifest_bomb_is_refused_in_bounded_memory() {
    // 3.2 M segments: 270 MB of JSON, a few hundred KiB stored.
    let (_keep, evil) = hostile_remote(3_200_000);
    let stored: u64 = walk_len(&evil.join("objects"));
    assert!(stored < 4 << 20, "the bomb is small on the wire: {stored} bytes");
    let url = evil.to_str().unwrap();
    let parent = tempfile::tempdir().unwrap();
    let (out, rss) = ckpt_measured(parent.path(), &["clone", url, "b"]);
    if let Some(rss) = rss {
        assert!(rss < 400 << 20, "clone peaked at {} MiB", rss >> 20);
    }
    assert!(!out.status.success(), "the clone must fail");
    let err = stderr(&out);
    assert!(err.contains("at most"), "the error names the cap: {err}");
    assert!(!parent.path().join("b").exists(), "a failed clone leaves no repository behind");

    let b = tempfile::tempdir().unwrap();
    assert!(ckpt_in(b.path(), &["init"]).status.success());
    assert!(ckpt_in(b.path(), &["remote", "add", "origin", url]).status.success());
    let (out, rss) = ckpt_measured(b.path(), &["fetch"]);
    if let Some(rss) = rss {
        assert!(rss < 400 << 20, "fetch peaked at {} MiB", rss >> 20);
    }
    assert!(!out.status.success(), "the fetch must fail");
    assert!(stderr(&out).contains("at most"), "the error names the cap: {}", stderr(&out));
    let verify = ckpt_in(b.path(), &["verify"]);
    assert!(verify.status.success(), "nothing bad was stored: {}", stderr(&verify));
}

fn walk_len(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        n += if p.is_dir() { walk_len(&p) } else { std::fs::metadata(&p).unwrap().len() };
    }
    n
}

/// The object file of `id` (hex) under a remote's `objects/`.
fn object_file(objects: &Path, hex: &str) -> std::path::PathBuf {
    objects.join(&hex[..2]).join(&hex[2..])
}

/// Item 2: a remote that lost the version object (or a manifest) its ref names is repaired
/// by the next push, not reported "up to date".
#[test]
fn push_uploads_again_what_the_remote_lost() {
    let r = directory().unwrap();
    let a = trained(&r, 5, 2);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    let head = std::fs::read_to_string(a.path().join(".ckpt/refs/heads/main")).unwrap();
    let head = head.trim();
    std::fs::remove_file(object_file(&r.objects, head)).unwrap();

    let report = json(&r.ok(a.path(), &["push", "--json"]));
    assert!(report["objects_sent"].as_u64().unwrap() >= 1, "{report}");
    assert_eq!(report["repaired"][0], head, "{report}");
    assert!(object_file(&r.objects, head).is_file(), "the version object is back on the remote");

    // A manifest lost the same way.
    let repo = ckpt::repo::Repo::open(a.path()).unwrap();
    let manifest = repo.version(&head.parse().unwrap()).unwrap().files[0].manifest.to_hex();
    drop(repo);
    std::fs::remove_file(object_file(&r.objects, &manifest)).unwrap();
    let report = json(&r.ok(a.path(), &["push", "--json"]));
    assert!(report["objects_sent"].as_u64().unwrap() >= 1, "{report}");
    assert!(object_file(&r.objects, &manifest).is_file());

    let parent = tempfile::tempdir().unwrap();
    r.ok(parent.path(), &["clone", &r.url, "b"]);
    assert_eq!(std::fs::read(parent.path().join("b/model.safetensors")).unwrap(), model(5, 1));
    r.ok(&parent.path().join("b"), &["verify"]);
}

/// Item 3: while a fetch waits on a dead endpoint, commits go on: the fetch takes the writer
/// lock only to store what arrived.
#[test]
fn a_stalled_fetch_does_not_block_commits() {
    let Some(r) = s3() else { return };
    let a = trained(&r, 7, 1);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    let parent = tempfile::tempdir().unwrap();
    r.ok(parent.path(), &["clone", &r.url, "b"]);
    let b = parent.path().join("b");
    std::fs::write(a.path().join("model.safetensors"), model(7, 1)).unwrap();
    r.ok(a.path(), &["commit", "-m", "epoch 1", "model.safetensors"]);
    r.ok(a.path(), &["push"]);

    let endpoint = r.env.iter().find(|(k, _)| *k == "AWS_ENDPOINT_URL").unwrap().1.clone();
    let port: u16 = endpoint.rsplit(':').next().unwrap().parse().unwrap();
    let proxy = Proxy::start(port);
    proxy.set(Fault::Stall { direction: Direction::Down, after: 0 }, 1000);
    let mut fetch = ckpt_command(&b, &["fetch"]);
    for (k, v) in &r.env {
        fetch.env(k, v);
    }
    let mut fetch = fetch.env("AWS_ENDPOINT_URL", proxy.endpoint()).env("CKPT_REMOTE_TIMEOUT", "30").spawn().unwrap();
    let started = Instant::now();
    while proxy.hits() == 0 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(proxy.hits() > 0, "the fetch reached the stalled endpoint");

    std::fs::write(b.join("model.safetensors"), model(8, 0)).unwrap();
    let t = Instant::now();
    let out = ckpt_command(&b, &["commit", "-m", "while fetching", "model.safetensors"])
        .env("CKPT_LOCK_TIMEOUT", "3")
        .output()
        .unwrap();
    let took = t.elapsed();
    let still_fetching = fetch.try_wait().unwrap().is_none();
    let _ = fetch.kill();
    let _ = fetch.wait();
    assert!(out.status.success(), "the commit failed while a fetch was stalled: {}", stderr(&out));
    assert!(took < Duration::from_secs(3), "the commit waited {took:?}");
    assert!(still_fetching, "the fetch was still stalled during the commit");

    // The endpoint back: the fetch completes and the commit is still there.
    drop(proxy);
    r.ok(&b, &["fetch"]);
    r.ok(&b, &["verify"]);
    let log = String::from_utf8_lossy(&r.ok(&b, &["log"]).stdout).into_owned();
    assert!(log.contains("while fetching"), "{log}");
    assert!(!b.join(".ckpt/incoming").read_dir().unwrap().any(|e| e.is_ok()), "staging is cleaned up");
}

/// Item 4: credentials in a URL are refused (not stored), and `remote -v` never prints a
/// secret, even from a remotes file written before they were refused.
#[test]
fn urls_with_credentials_are_refused_and_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    assert!(ckpt_in(dir.path(), &["init"]).status.success());
    for (url, extra) in [
        ("s3://AKIAEXAMPLE:hunter2@bucket/prefix", None),
        ("s3://bucket/prefix?X-Amz-Signature=hunter2", None),
        ("file://user:hunter2@localhost/tmp/x", None),
        ("s3://bucket/prefix", Some("http://key:hunter2@127.0.0.1:9000")),
        ("s3://bucket/prefix", Some("http://127.0.0.1:9000/?token=hunter2")),
    ] {
        let mut args = vec!["remote", "add", "origin", url];
        if let Some(e) = extra {
            args.extend(["--endpoint", e]);
        }
        let out = ckpt_in(dir.path(), &args);
        assert!(!out.status.success(), "{args:?} was accepted");
        let err = stderr(&out);
        assert!(err.contains("AWS_ACCESS_KEY_ID"), "the message says where credentials go: {err}");
        assert!(!err.contains("hunter2"), "the secret was printed: {err}");
        let stored = std::fs::read_to_string(dir.path().join(".ckpt/remotes")).unwrap_or_default();
        assert!(!stored.contains("hunter2"), "the secret was stored: {stored}");
    }
    let out = ckpt_in(dir.path(), &["clone", "s3://k:hunter2@bucket/p", "c"]);
    assert!(!out.status.success() && !stderr(&out).contains("hunter2"), "{}", stderr(&out));
    assert!(!dir.path().join("c").exists());

    // Written by an older ckpt: shown redacted.
    std::fs::write(
        dir.path().join(".ckpt/remotes"),
        r#"{"old": {"url": "s3://k:hunter2@bucket/p?X-Amz-Signature=hunter2", "s3": {"endpoint": "http://u:hunter2@h:1/?token=hunter2"}}}"#,
    )
    .unwrap();
    let out = ckpt_in(dir.path(), &["remote", "-v"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(shown.contains("old") && shown.contains("bucket/p"), "{shown}");
    assert!(!shown.contains("hunter2"), "remote -v printed a secret: {shown}");
}

/// Item 5: a failed clone removes exactly what it created; a clone into a non-empty
/// directory is refused and touches nothing; `pull` does not suggest a `--force` it lacks.
#[test]
fn a_failed_clone_removes_only_what_it_created() {
    let r = directory().unwrap();
    let a = trained(&r, 9, 1);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    // A remote whose version object is damaged: the clone fails after creating the repository.
    let head = std::fs::read_to_string(a.path().join(".ckpt/refs/heads/main")).unwrap();
    let version = object_file(&r.objects, head.trim());
    let good = std::fs::read(&version).unwrap();
    let mut bad = good.clone();
    let n = bad.len();
    bad[n / 2] ^= 0xff;
    std::fs::write(&version, &bad).unwrap();

    let parent = tempfile::tempdir().unwrap();
    let out = r.ckpt(parent.path(), &["clone", &r.url, "x/y/b"]);
    assert!(!out.status.success(), "the clone of a damaged remote must fail");
    assert!(!parent.path().join("x").exists(), "the directories it made are removed");

    let empty = parent.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = r.ckpt(parent.path(), &["clone", &r.url, "empty"]);
    assert!(!out.status.success());
    assert!(empty.is_dir(), "an empty directory it was given stays");
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0, "and stays empty");

    std::fs::write(&version, &good).unwrap();
    let full = parent.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("notes.txt"), b"mine").unwrap();
    let out = r.ckpt(parent.path(), &["clone", &r.url, "full"]);
    assert!(!out.status.success(), "a clone into a non-empty directory is refused");
    assert!(stderr(&out).contains("not an empty directory"), "{}", stderr(&out));
    assert_eq!(std::fs::read_dir(&full).unwrap().count(), 1, "nothing was added");
    assert!(stderr(&out).lines().all(|l| !l.contains("--force")), "{}", stderr(&out));

    // pull blocked by a modified file: the message names what exists.
    r.ok(parent.path(), &["clone", &r.url, "b"]);
    let b = parent.path().join("b");
    std::fs::write(b.join("model.safetensors"), model(10, 0)).unwrap();
    std::fs::write(a.path().join("model.safetensors"), model(9, 1)).unwrap();
    r.ok(a.path(), &["commit", "-m", "epoch 1", "model.safetensors"]);
    r.ok(a.path(), &["push"]);
    let out = r.ckpt(&b, &["pull"]);
    assert!(!out.status.success(), "pull must not overwrite a modified file");
    let err = stderr(&out);
    assert!(err.contains("model.safetensors") && !err.contains("--force"), "{err}");
    let help = String::from_utf8_lossy(&ckpt_in(&b, &["pull", "--help"]).stdout).into_owned();
    assert!(!help.contains("--force"), "if pull gains --force, the message may suggest it");
}

/// Item 6: the directory a clone derives from its URL is a plain name (never `..`, `.` or
/// empty), and directory remotes are stored absolute: commands work from any subdirectory,
/// and relative paths written by an older ckpt resolve against the working tree's root.
#[test]
fn clone_names_and_relative_directory_remotes() {
    let r = directory().unwrap();
    let a = trained(&r, 11, 1);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    let remote_dir = Path::new(&r.url);
    let inside = remote_dir.join("refs");
    for url in ["..", ".", "/", "file:///", "s3://bucket/prefix/..", &format!("{}/.", r.url)] {
        let out = ckpt_in(&inside, &["clone", url]);
        assert!(!out.status.success(), "clone {url} derived a directory");
        assert!(stderr(&out).contains("name one"), "{url}: {}", stderr(&out));
    }
    assert!(!remote_dir.join(".ckpt").exists(), "nothing was cloned into the remote's directory");

    // A relative remote path, from the directory that holds it: its derived name is the
    // remote's own directory, which is not empty, so that clone is refused; named, it works.
    let parent = remote_dir.parent().unwrap();
    let out = ckpt_in(parent, &["clone", "remote"]);
    assert!(!out.status.success() && stderr(&out).contains("not an empty directory"), "{}", stderr(&out));
    assert!(!remote_dir.join(".ckpt").exists());
    r.ok(parent, &["clone", "remote", "work"]);
    let work = parent.join("work");
    let remotes = std::fs::read_to_string(work.join(".ckpt/remotes")).unwrap();
    assert!(remotes.contains(&r.url), "stored absolute: {remotes}");
    std::fs::create_dir(work.join("sub")).unwrap();
    r.ok(&work.join("sub"), &["fetch"]);

    // `remote add` with a relative path, from a subdirectory.
    let c = tempfile::tempdir().unwrap();
    r.ok(c.path(), &["init"]);
    std::fs::create_dir(c.path().join("deep")).unwrap();
    let rel = pathdiff(&c.path().join("deep"), remote_dir);
    r.ok(&c.path().join("deep"), &["remote", "add", "origin", &rel]);
    let remotes = std::fs::read_to_string(c.path().join(".ckpt/remotes")).unwrap();
    assert!(!remotes.contains("\"url\": \".."), "stored absolute: {remotes}");
    r.ok(c.path(), &["fetch"]);

    // Written relative by an older ckpt: relative to the working tree's root, from anywhere.
    let rel_to_root = pathdiff(c.path(), remote_dir);
    std::fs::write(c.path().join(".ckpt/remotes"), format!(r#"{{"origin": {{"url": "{rel_to_root}"}}}}"#)).unwrap();
    r.ok(&c.path().join("deep"), &["fetch"]);
    r.ok(c.path(), &["fetch"]);
}

/// `to` relative to `from` (both absolute), with `..` components.
fn pathdiff(from: &Path, to: &Path) -> String {
    let from: Vec<_> = std::fs::canonicalize(from).unwrap().components().map(|c| c.as_os_str().to_owned()).collect();
    let to: Vec<_> = std::fs::canonicalize(to).unwrap().components().map(|c| c.as_os_str().to_owned()).collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".to_string(); from.len() - common];
    parts.extend(to[common..].iter().map(|c| c.to_string_lossy().into_owned()));
    parts.join("/")
}
