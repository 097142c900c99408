//! Push, round 2 (issue #39): a push never spreads bit rot from the local store to a remote
//! (item 5), never recodes a remote blob against a damaged copy, and a remote damaged by an
//! older push is repaired from a healthy clone with `push --repair`; a push that waits for a
//! remote gc says so (item 9a); a pruned repository's refused push names prune and leaves
//! nothing on the remote (item 9b). Each against a directory remote and an S3 server.

use crate::support::layout::{remote_objects, version_blobs, version_objects};
use crate::support::remote::{
    clone_reads, directory, json, model, open_remote, s3, trained, NoRecodes, Served, SECRET_KEY,
};
use crate::support::repo_util::{ckpt_command, stderr};
use ckpt::remote::Expect;
use ckpt::repo::Repo;
use ckpt::sync::{self, PushOptions};
use ckpt::ObjectId;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The remote's root on disk (a directory remote, or the directory `s3s-fs` keeps its prefix in).
fn root(r: &Served) -> PathBuf {
    r.objects.parent().unwrap().to_path_buf()
}

fn object_file(objects: &Path, id: &ObjectId) -> PathBuf {
    let hex = id.to_hex();
    objects.join(&hex[..2]).join(&hex[2..])
}

/// Flips one bit in the middle of the file (past the header: the object still opens).
fn flip(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
}

/// Every file under `dir` (s3s-fs keeps no files of its own under a prefix).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn remote_ref(r: &Served, branch: &str) -> String {
    std::fs::read_to_string(root(r).join("refs/heads").join(branch)).unwrap().trim().to_string()
}

fn head(dir: &Path) -> String {
    let repo = Repo::open(dir).unwrap();
    repo.resolve("main").unwrap().to_hex()
}

/// Item 5, the repro: after a push of v0, v1 is committed and one of its new blobs rots in
/// the local store. The push is refused before anything goes up, naming the blob; the remote
/// keeps v0 intact (its blobs are not recoded against anything) and holds nothing of v1.
fn a_push_never_sends_an_object_damaged_here(r: &Served) {
    let a = trained(r, 7, 1);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    let v0 = head(a.path());
    std::fs::write(a.path().join("model.safetensors"), model(7, 1)).unwrap();
    r.ok(a.path(), &["commit", "-m", "epoch 1", "model.safetensors"]);
    let old = version_blobs(a.path(), "main~1");
    let new: Vec<ObjectId> = version_blobs(a.path(), "main").into_iter().filter(|b| !old.contains(b)).collect();
    let v1_objects: Vec<ObjectId> =
        version_objects(a.path(), "main").into_iter().filter(|o| !old.contains(o)).collect();
    let remote_before = remote_objects(&r.objects);
    flip(&object_file(&a.path().join(".ckpt/objects"), &new[0]));

    let out = r.ckpt(a.path(), &["push"]);
    assert_eq!(out.status.code(), Some(1), "the push must be refused: {}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&new[0].to_hex()) && err.contains("damaged"), "names the damaged blob: {err}");
    assert!(err.contains("nothing that needs"), "{err}");
    // Nothing of v1 went up, nothing was recoded, no journal is left.
    assert_eq!(remote_ref(r, "main"), v0);
    let remote_after = remote_objects(&r.objects);
    assert!(v1_objects.iter().all(|o| !remote_after.contains_key(o)), "an object of v1 went up");
    assert_eq!(remote_after.len(), remote_before.len());
    for (id, o) in &remote_after {
        assert_eq!((o.size, o.header.reference), (remote_before[id].size, remote_before[id].header.reference));
    }
    assert!(files_under(&root(r).join("pending")).is_empty(), "a journal was left");
    clone_reads(r, &[("main", model(7, 0))]);
}

/// Item 5, the recode's side: v0's blob, recoded here as a delta against v1's by compaction,
/// rots locally. A mirror push of v1 would replace the remote's intact copy by that delta:
/// the push is refused before anything goes up, and the remote keeps v0 as it was.
fn a_recode_from_a_blob_damaged_here_is_refused(r: &Served) {
    let a = trained(r, 13, 1);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    let v0 = head(a.path());
    std::fs::write(a.path().join("model.safetensors"), model(13, 1)).unwrap();
    r.ok(a.path(), &["commit", "-m", "epoch 1", "model.safetensors"]);
    let repo = Repo::open(a.path()).unwrap();
    let older = version_blobs(a.path(), "main~1")
        .into_iter()
        .find(|b| repo.store().header(b).unwrap().reference.is_some())
        .expect("compaction made a v0 blob a delta against v1's");
    let remote_before = remote_objects(&r.objects);
    flip(&object_file(&a.path().join(".ckpt/objects"), &older));

    let out = r.ckpt(a.path(), &["push"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains(&older.to_hex()), "{}", stderr(&out));
    assert_eq!(remote_ref(r, "main"), v0);
    let remote_after = remote_objects(&r.objects);
    assert_eq!(remote_after.keys().collect::<std::collections::BTreeSet<_>>(), remote_before.keys().collect());
    assert_eq!(remote_after[&older].header.reference, None, "v0's blob was recoded there");
    clone_reads(r, &[("main", model(13, 0))]);
}

/// Item 5, the repair: a remote an older ckpt damaged (v1's blob rotten there, and v0's blob a
/// delta against it: both versions unreadable) is repaired by `push --repair` from a healthy
/// clone: it downloads and checks every object main needs, and replaces each damaged one by
/// an intact copy. A plain push cannot (the remote's refs say it has everything), and a
/// second repair finds nothing.
fn push_repair_replaces_what_the_remote_holds_damaged(r: &Served) {
    let a = trained(r, 9, 2);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    // A blob of v1 that the remote's copy of a v0 blob is a delta against.
    let objects = remote_objects(&r.objects);
    let v1 = version_blobs(a.path(), "main");
    let rotten = objects
        .values()
        .filter_map(|o| o.header.reference)
        .find(|reference| v1.contains(reference))
        .expect("a mirror push recodes v0's blobs against v1's");
    flip(&object_file(&r.objects, &rotten));
    let parent = tempfile::tempdir().unwrap();
    let broken = r.ckpt(parent.path(), &["clone", &r.url, "c"]);
    assert!(!broken.status.success(), "the damage shows");

    let plain = json(&r.ok(a.path(), &["push", "--json"]));
    assert_eq!(plain["objects_sent"], 0, "{plain}");

    let repair = json(&r.ok(a.path(), &["push", "--repair", "--json"]));
    assert_eq!(repair["replaced_damaged"], serde_json::json!([rotten.to_hex()]), "{repair}");
    assert!(repair["remote_checked"].as_u64().unwrap() >= objects.len() as u64, "{repair}");
    assert_eq!(repair["objects_sent"], 1, "{repair}");
    // Replaced by its standalone form, which a delta on it decodes against as before.
    let after = remote_objects(&r.objects);
    assert_eq!(after[&rotten].header.reference, None);
    assert_eq!(after.len(), objects.len());
    clone_reads(r, &[("main", model(9, 1)), ("main~1", model(9, 0))]);

    let again = json(&r.ok(a.path(), &["push", "--repair", "--json"]));
    assert_eq!(again["replaced_damaged"], serde_json::json!([]), "{again}");
    assert_eq!(again["objects_sent"], 0, "{again}");
    // The words a person reads.
    let out = r.ok(a.path(), &["push", "--repair"]);
    assert!(stderr(&out).contains("checked") && stderr(&out).contains("0 damaged"), "{}", stderr(&out));
}

/// Item 5, never recode against a reference not verified: a mirror push killed after its ref
/// moved leaves its journal; the newer blobs it uploaded then rot on the remote. The next push
/// finishes the journal: it checks the remote's copy of each newer blob before coding an older
/// one against it, replaces the damaged ones by intact copies, and only then recodes, so both
/// versions stay readable (before, v0's blobs became deltas against the rotten copies).
fn a_journal_is_not_finished_against_a_damaged_blob(r: &Served) {
    let a = trained(r, 11, 1);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    std::fs::write(a.path().join("model.safetensors"), model(11, 1)).unwrap();
    r.ok(a.path(), &["commit", "-m", "epoch 1", "model.safetensors"]);
    let repo = Repo::open(a.path()).unwrap();
    let options = PushOptions { transfers: 2, ..PushOptions::default() };
    assert!(sync::push_to(&repo, &NoRecodes(open_remote(r)), &options).is_err(), "the recodes fail");
    assert_eq!(remote_ref(r, "main"), head(a.path()), "the ref moved");
    let journals = files_under(&root(r).join("pending"));
    assert_eq!(journals.len(), 1, "the journal is left");
    // The newer blobs of its recodes (v1's), rotten on the remote.
    let journal: serde_json::Value = serde_json::from_slice(&std::fs::read(&journals[0]).unwrap()).unwrap();
    let new: Vec<ObjectId> =
        journal["recodes"].as_array().unwrap().iter().map(|r| r["newer"].as_str().unwrap().parse().unwrap()).collect();
    assert!(!new.is_empty(), "{journal}");
    for b in &new {
        flip(&object_file(&r.objects, b));
    }

    let out = r.ok(a.path(), &["push", "--json"]);
    let report = json(&out);
    assert!(files_under(&root(r).join("pending")).is_empty(), "the journal is finished: {report}");
    assert!(report["objects_recoded"].as_u64().unwrap() > 0, "{report}");
    let after = remote_objects(&r.objects);
    assert!(new.iter().all(|b| after[b].header.reference.is_none()), "the newer blobs are whole there");
    clone_reads(r, &[("main", model(11, 1)), ("main~1", model(11, 0))]);
}

/// Item 9b: `prune --keep-last` then a push to an empty remote is refused, naming prune as the
/// cause, and decided before anything goes up: the remote holds no file afterwards.
fn a_pruned_push_is_refused_naming_prune_and_leaves_nothing(r: &Served) {
    let a = trained(r, 8, 4);
    r.ok(a.path(), &["prune", "--keep-last", "2"]);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    let out = r.ckpt(a.path(), &["push"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("ckpt prune") && err.contains("dropped"), "names prune: {err}");
    assert!(!err.contains("partial clone"), "{err}");
    assert_eq!(files_under(&root(r)), Vec::<PathBuf>::new(), "a refused push left files on the remote");
}

/// Item 9a: a `gc --remote` killed outright leaves its record, and the next push that needs to
/// settle waits ten minutes before it takes the gc for dead. It says so at once: what it waits
/// for (the record), since when and until when.
fn a_push_waiting_for_a_remote_gc_says_so(r: &Served) {
    let a = trained(r, 5, 1);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    let record = "gc/run-0123456789abcdef0123456789abcdef";
    open_remote(r).put_small(record, b"ckpt gc --remote running (pid 1, beat 0)\n", &Expect::Absent).unwrap();
    std::fs::write(a.path().join("model.safetensors"), model(5, 1)).unwrap();
    r.ok(a.path(), &["commit", "-m", "epoch 1", "model.safetensors"]);

    let mut command = ckpt_command(a.path(), &["push"]);
    for (k, v) in &r.env {
        command.env(k, v);
    }
    let mut child = command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let lines = std::io::BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in lines.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let began = Instant::now();
    let mut said = None;
    while began.elapsed() < Duration::from_secs(60) && said.is_none() {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            if line.contains(record) {
                said = Some(line);
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let said = said.expect("the push says what it waits for");
    assert!(said.contains("waits for a ckpt gc --remote"), "{said}");
    assert!(said.contains("last written at") && said.contains("unchanged since"), "since when: {said}");
    assert!(said.contains("taken for dead at") && said.contains("at the latest"), "until when: {said}");
    assert!(!said.contains(SECRET_KEY));
}

crate::support::remote::remote_suite!(
    a_push_never_sends_an_object_damaged_here,
    a_recode_from_a_blob_damaged_here_is_refused,
    push_repair_replaces_what_the_remote_holds_damaged,
    a_journal_is_not_finished_against_a_damaged_blob,
    a_pruned_push_is_refused_naming_prune_and_leaves_nothing,
    a_push_waiting_for_a_remote_gc_says_so
);
