//! Deltas on the wire and partial clones (issue 21), through the `ckpt` binary against a
//! directory remote and a real S3-protocol server (`s3s-fs`, as in `support/remote.rs`): with
//! `--layout deltas` (the mirror layout is tested in `remote_layout.rs`), a push after an epoch sends the new blobs as XOR deltas against the remote's, fetch and clone rebuild
//! every version bit-exactly, a damaged delta or a missing base is refused and named, chains on
//! the remote stay bounded, and `clone --depth` downloads only the newest versions until a
//! checkout asks for an older one.

use crate::support::remote::{directory, json, model, s3, trained, Served};
use crate::support::repo_util::{read_tree, stderr};
use std::path::{Path, PathBuf};

/// Every object file under a remote's `objects/` (s3s-fs keeps metadata files beside them:
/// only names of 62 hex digits count), by id.
fn remote_objects(objects: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for fan in std::fs::read_dir(objects).unwrap() {
        let fan = fan.unwrap().path();
        let Some(prefix) = fan.file_name().map(|n| n.to_string_lossy().into_owned()) else { continue };
        if !fan.is_dir() || prefix.len() != 2 {
            continue;
        }
        for f in std::fs::read_dir(&fan).unwrap() {
            let p = f.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if name.len() == 62 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
                out.push((format!("{prefix}{name}"), p));
            }
        }
    }
    out.sort();
    out
}

/// The delta reference named in an object file's header (docs/format.md, "Objects"), if any.
fn reference_of(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).unwrap();
    (bytes[12] & 1 == 1).then(|| bytes[32..64].iter().map(|b| format!("{b:02x}")).collect())
}

/// The longest chain of deltas on the remote (0: everything standalone).
fn deepest_remote_chain(objects: &Path) -> usize {
    let all: std::collections::HashMap<String, PathBuf> = remote_objects(objects).into_iter().collect();
    let mut deepest = 0;
    for path in all.values() {
        let mut depth = 0;
        let mut next = reference_of(path);
        while let Some(r) = next {
            depth += 1;
            assert!(depth < 100, "a reference cycle on the remote");
            next = reference_of(all.get(&r).expect("every delta's base is on the remote"));
        }
        deepest = deepest.max(depth);
    }
    deepest
}

/// `rev` checked out from the repository in `dir` into a fresh directory: its files.
fn checked_out(r: &Served, dir: &Path, rev: &str) -> Vec<(String, Vec<u8>)> {
    let out = tempfile::tempdir().unwrap();
    r.ok(dir, &["checkout", rev, "--output", out.path().to_str().unwrap()]);
    read_tree(out.path())
}

fn epoch_after_epoch_goes_up_as_deltas(r: &Served) {
    let a = trained(r, 11, 1);
    r.ok(a.path(), &["remote", "add", "origin", &r.url, "--layout", "deltas"]);
    let first = json(&r.ok(a.path(), &["push", "--json"]));
    let whole = first["bytes_sent"].as_u64().unwrap();
    assert_eq!(first["objects_sent_as_deltas"], 0, "nothing to code against yet: {first}");
    let parent = tempfile::tempdir().unwrap();
    r.ok(parent.path(), &["clone", &r.url, "b"]);
    let b = parent.path().join("b");

    for epoch in 1..3 {
        std::fs::write(a.path().join("model.safetensors"), model(11, epoch)).unwrap();
        r.ok(a.path(), &["commit", "-m", &format!("epoch {epoch}"), "model.safetensors"]);
        let push = json(&r.ok(a.path(), &["push", "--json"]));
        let sent = push["bytes_sent"].as_u64().unwrap();
        assert!(push["objects_sent_as_deltas"].as_u64().unwrap() > 0, "{push}");
        assert!(2 * sent < whole, "epoch {epoch} sent {sent} bytes, a whole version is {whole}: {push}");

        // A clone made before fetches the delta-coded objects and rebuilds the version.
        r.ok(&b, &["pull"]);
        assert_eq!(std::fs::read(b.join("model.safetensors")).unwrap(), model(11, epoch));
    }
    // A fresh clone: every version bit-exact, and the store verifies.
    let fresh = tempfile::tempdir().unwrap();
    r.ok(fresh.path(), &["clone", &r.url, "c"]);
    let c = fresh.path().join("c");
    for n in 0..3 {
        let rev = format!("main~{n}");
        let files = checked_out(r, &c, &rev);
        assert_eq!(files, vec![("model.safetensors".to_string(), model(11, 2 - n))], "{rev}");
    }
    r.ok(&c, &["verify"]);
    r.ok(&b, &["verify"]);
}

fn damaged_delta_and_missing_base_are_refused(r: &Served) {
    let a = trained(r, 12, 1);
    r.ok(a.path(), &["remote", "add", "origin", &r.url, "--layout", "deltas"]);
    r.ok(a.path(), &["push"]);
    std::fs::write(a.path().join("model.safetensors"), model(12, 1)).unwrap();
    r.ok(a.path(), &["commit", "-m", "epoch 1", "model.safetensors"]);
    let push = json(&r.ok(a.path(), &["push", "--json"]));
    assert!(push["objects_sent_as_deltas"].as_u64().unwrap() > 0, "{push}");

    // The largest delta on the remote, altered in its payload.
    let (id, path) = remote_objects(&r.objects)
        .into_iter()
        .filter(|(_, p)| reference_of(p).is_some())
        .max_by_key(|(_, p)| std::fs::metadata(p).unwrap().len())
        .expect("a delta object on the remote");
    let original = std::fs::read(&path).unwrap();
    let mut bytes = original.clone();
    let at = 72 + (bytes.len() - 72) / 2;
    bytes[at] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let parent = tempfile::tempdir().unwrap();
    let out = r.ckpt(parent.path(), &["clone", &r.url, "b"]);
    assert!(!out.status.success(), "a clone with a damaged delta must fail");
    assert!(stderr(&out).contains(&id), "the error names the delta {id}: {}", stderr(&out));
    assert!(!parent.path().join("b/.ckpt/objects").join(&id[..2]).join(&id[2..]).exists());
    assert!(!parent.path().join("b/.ckpt/refs/remotes/origin/main").exists());

    // Restored, but with its base gone from the remote: refused, naming the delta (a partial
    // clone, so that no version it fetches names the base itself).
    std::fs::write(&path, &original).unwrap();
    let base = reference_of(&path).unwrap();
    std::fs::remove_file(r.objects.join(&base[..2]).join(&base[2..])).unwrap();
    let parent = tempfile::tempdir().unwrap();
    let out = r.ckpt(parent.path(), &["clone", "--depth", "1", &r.url, "b"]);
    assert!(!out.status.success(), "a clone with a missing base must fail");
    let err = stderr(&out);
    assert!(err.contains(&id) && err.contains(&base) && err.contains("missing"), "{err}");
    assert!(!parent.path().join("b/.ckpt/objects").join(&id[..2]).join(&id[2..]).exists());
}

fn chains_on_the_remote_stay_bounded(r: &Served) {
    let dir = tempfile::tempdir().unwrap();
    r.ok(dir.path(), &["init"]);
    std::fs::write(dir.path().join(".ckpt/config"), r#"{"base_every": 3}"#).unwrap();
    r.ok(dir.path(), &["remote", "add", "origin", &r.url, "--layout", "deltas"]);
    let mut deltas = 0;
    let mut deepest_seen = 0;
    for epoch in 0..7 {
        std::fs::write(dir.path().join("model.safetensors"), model(13, epoch)).unwrap();
        r.ok(dir.path(), &["commit", "-m", &format!("epoch {epoch}"), "model.safetensors"]);
        deltas += json(&r.ok(dir.path(), &["push", "--json"]))["objects_sent_as_deltas"].as_u64().unwrap();
        // At most `base_every` deltas (from the root to the first pinned version; later
        // intervals start whole right after a pinned version).
        let deepest = deepest_remote_chain(&r.objects);
        assert!(deepest <= 3, "after epoch {epoch}: a chain of {deepest} deltas on the remote (base_every 3)");
        deepest_seen = deepest_seen.max(deepest);
    }
    assert!(deltas > 0 && deepest_seen >= 2, "chains do form: {deltas} deltas, deepest {deepest_seen}");
    let parent = tempfile::tempdir().unwrap();
    r.ok(parent.path(), &["clone", &r.url, "b"]);
    let b = parent.path().join("b");
    for n in 0..7u32 {
        let files = checked_out(r, &b, &format!("main~{n}"));
        assert_eq!(files[0].1, model(13, 6 - n), "main~{n}");
    }
}

fn partial_clone_fetches_older_versions_on_checkout(r: &Served) {
    // Pushed epoch by epoch with a base every 3 versions: epoch 3 goes up whole, epoch 4 as a
    // delta on it, so the newest version needs neither epochs 0-2 nor their blobs.
    let a = tempfile::tempdir().unwrap();
    r.ok(a.path(), &["init"]);
    std::fs::write(a.path().join(".ckpt/config"), r#"{"base_every": 3}"#).unwrap();
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    for epoch in 0..5 {
        std::fs::write(a.path().join("model.safetensors"), model(14, epoch)).unwrap();
        r.ok(a.path(), &["commit", "-m", &format!("epoch {epoch}"), "model.safetensors"]);
        r.ok(a.path(), &["push"]);
    }
    let parent = tempfile::tempdir().unwrap();
    let full = json(&r.ok(parent.path(), &["clone", "--json", &r.url, "full"]));
    let partial = json(&r.ok(parent.path(), &["clone", "--json", "--depth", "1", &r.url, "b"]));
    let b = parent.path().join("b");
    let (got, all) = (partial["bytes_received"].as_u64().unwrap(), full["bytes_received"].as_u64().unwrap());
    assert!(got * 3 < all * 2, "--depth 1 received {got} bytes, the whole history is {all}");
    assert_eq!(std::fs::read(b.join("model.safetensors")).unwrap(), model(14, 4));
    assert!(b.join(".ckpt/partial").exists());

    // log shows what is here and where history is cut; verify and gc accept the cut.
    let log = String::from_utf8_lossy(&r.ok(&b, &["log", "--oneline"]).stdout).into_owned();
    assert_eq!(log.lines().filter(|l| l.contains("epoch")).count(), 1, "{log}");
    assert!(log.contains("history cut here"), "{log}");
    r.ok(&b, &["verify"]);
    r.ok(&b, &["gc", "--prune=now"]);

    // An older version: downloaded on checkout, bit-exact; then it is here.
    let older = checked_out(r, &b, "main~2");
    assert_eq!(older, vec![("model.safetensors".to_string(), model(14, 2))]);
    r.ok(&b, &["verify"]);
    let again = json(&r.ok(&b, &["fetch", "--json"]));
    assert_eq!(again["objects_received"], 0, "{again}");

    // Building on top of a partial clone and pushing works (the remote has the history).
    std::fs::write(b.join("model.safetensors"), model(14, 5)).unwrap();
    r.ok(&b, &["commit", "-m", "epoch 5", "model.safetensors"]);
    r.ok(&b, &["push"]);
    r.ok(a.path(), &["pull"]);
    assert_eq!(std::fs::read(a.path().join("model.safetensors")).unwrap(), model(14, 5));

    // Offline: the error names the remote.
    let moved = tempfile::tempdir().unwrap();
    let config = std::fs::read_to_string(b.join(".ckpt/remotes")).unwrap();
    let gone = config.replace(&r.url.replace('\\', "\\\\"), moved.path().join("nowhere").to_str().unwrap());
    std::fs::write(b.join(".ckpt/remotes"), gone).unwrap();
    let out = r.ckpt(&b, &["checkout", "main~5", "--output", moved.path().to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("remote origin"), "{}", stderr(&out));
}

crate::support::remote::remote_suite!(
    epoch_after_epoch_goes_up_as_deltas,
    damaged_delta_and_missing_base_are_refused,
    chains_on_the_remote_stay_bounded,
    partial_clone_fetches_older_versions_on_checkout
);
