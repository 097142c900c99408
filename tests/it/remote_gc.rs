//! `ckpt gc --remote`: the objects of a refused push go once older than the grace period,
//! everything a ref reaches stays (clones read every version, bit for bit), young objects stay,
//! and a push that counts on an old object no ref reaches writes it again, so that a gc
//! running in the middle of the push cannot take it (docs/format.md, "Garbage on a remote").
//! Against a directory remote (whose object ages the tests can set) and, where `s3s-fs`,
//! Azurite and the GCS emulator are installed, a real S3-protocol server and the emulators (with
//! `--prune=now`: their ages cannot be set).

use crate::support::remote::{azurite, clone_reads, directory, gcs, json, model, open_remote, s3, trained, Served};
use ckpt::remote::{local::DirRemote, Listed, Remote};
use ckpt::repo::Repo;
use ckpt::sync::{self, PushOptions, RemoteGcOptions};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

/// The object keys on the remote (as `ab/<62 hex>`), as its own listing gives them.
fn object_keys(r: &Served) -> BTreeSet<String> {
    let listed = open_remote(r).list("objects/").unwrap();
    listed.into_iter().filter_map(|k| k.strip_prefix("objects/").map(str::to_string)).collect()
}

/// The objects of a store laid out as `objects/ab/<62 hex>`, as `ab/<62 hex>`.
fn keys_under(objects: &Path) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let Ok(fans) = std::fs::read_dir(objects) else { return keys };
    for fan in fans {
        let fan = fan.unwrap();
        for object in std::fs::read_dir(fan.path()).unwrap() {
            let object = object.unwrap();
            keys.insert(format!("{}/{}", fan.file_name().to_string_lossy(), object.file_name().to_string_lossy()));
        }
    }
    keys
}

/// Sets the mtime of every object file of a directory remote `age` into the past.
fn age_objects(objects: &Path, age: Duration) {
    let then = SystemTime::now() - age;
    for fan in std::fs::read_dir(objects).unwrap() {
        for object in std::fs::read_dir(fan.unwrap().path()).unwrap() {
            let path = object.unwrap().path();
            std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_modified(then).unwrap();
        }
    }
}

/// a pushes two versions; b clones them, commits its own third and pushes it, and the push
/// dies before its ref moves (its compare-and-swap fails, as a kill or a lost race leaves
/// it): b's new objects are on the remote, unreferenced. Then a pushes its own third. Returns
/// a, b, the objects the remote's refs reach and the dead push's.
fn dead_push(r: &Served) -> (tempfile::TempDir, tempfile::TempDir, BTreeSet<String>, BTreeSet<String>) {
    let a = trained(r, 7, 2);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    let b = tempfile::tempdir().unwrap();
    r.ok(b.path(), &["clone", &r.url, "b"]);
    let b_dir = b.path().join("b");
    let before = object_keys(r);
    std::fs::write(b_dir.join("model.safetensors"), model(77, 2)).unwrap();
    r.ok(&b_dir, &["commit", "-m", "b's epoch 2", "model.safetensors"]);
    let dies = Hooked::new(open_remote(r), Hooks { refs_fail: true, ..Hooks::default() });
    let b_repo = Repo::open(&b_dir).unwrap();
    assert!(sync::push_to(&b_repo, &dies, &PushOptions { transfers: 4, ..PushOptions::default() }).is_err());
    assert!(object_keys(r).len() > before.len(), "the dead push left objects");
    std::fs::write(a.path().join("model.safetensors"), model(7, 2)).unwrap();
    r.ok(a.path(), &["commit", "-m", "a's epoch 2", "model.safetensors"]);
    r.ok(a.path(), &["push"]);
    // What the refs reach: the objects a clone of every version holds (the remote's delta
    // references are blobs of that history too).
    let parent = tempfile::tempdir().unwrap();
    r.ok(parent.path(), &["clone", &r.url, "c"]);
    let history = keys_under(&parent.path().join("c/.ckpt/objects"));
    let (reachable, garbage) = object_keys(r).into_iter().partition(|k| history.contains(k));
    (a, b, reachable, garbage)
}

fn young_garbage_stays_and_old_garbage_goes(r: &Served, can_age: bool) {
    let (a, b, reachable, garbage) = dead_push(r);
    // Young: kept whatever it is (a save may still be writing it).
    let young = json(&r.ok(a.path(), &["gc", "--remote", "origin", "--json"]));
    assert_eq!(young["deleted"], 0, "{young}");
    assert_eq!(young["recent"].as_u64().unwrap(), garbage.len() as u64, "{young}");
    assert_eq!(object_keys(r), reachable.union(&garbage).cloned().collect());

    let prune: &[&str] = if can_age {
        age_objects(&r.objects, Duration::from_secs(2 * 86400));
        &[]
    } else {
        &["--prune=now"]
    };
    let dry = json(&r.ok(a.path(), &[&["gc", "--remote", "origin", "--json", "--dry-run"], prune].concat()));
    assert_eq!(dry["deleted"].as_u64().unwrap(), garbage.len() as u64, "{dry}");
    assert!(dry["bytes_freed"].as_u64().unwrap() > 0, "{dry}");
    assert_eq!(object_keys(r).len(), reachable.len() + garbage.len(), "a dry run deletes nothing");
    // By URL, from a directory with no repository (a remote only ranks ever wrote to).
    let url = if r.url.contains("://") { r.url.clone() } else { format!("file://{}", r.url) };
    let nowhere = tempfile::tempdir().unwrap();
    let by_url = json(&r.ok(nowhere.path(), &[&["gc", "--remote", &url, "--json", "--dry-run"], prune].concat()));
    assert_eq!(by_url["deleted"], dry["deleted"], "{by_url}");
    assert_eq!(by_url["kept"], dry["kept"], "{by_url}");

    let done = json(&r.ok(a.path(), &[&["gc", "--remote", "origin", "--json"], prune].concat()));
    assert_eq!(done["deleted"], dry["deleted"], "{done}");
    assert_eq!(done["versions"], 3, "{done}");
    assert_eq!(object_keys(r), reachable, "exactly the refused push's objects went");
    clone_reads(r, &[("main", model(7, 2)), ("main~1", model(7, 1)), ("main~2", model(7, 0))]);

    // b rebases and pushes: what gc took goes up again.
    let b_dir = b.path().join("b");
    r.ok(&b_dir, &["pull", "--rebase"]);
    r.ok(&b_dir, &["push"]);
    clone_reads(r, &[("main", model(77, 2)), ("main~1", model(7, 2)), ("main~3", model(7, 0))]);
    let again = json(&r.ok(a.path(), &[&["gc", "--remote", "origin", "--json"], prune].concat()));
    assert_eq!(again["deleted"], 0, "{again}");
}

#[test]
fn gc_of_a_directory_remote_takes_only_old_garbage() {
    young_garbage_stays_and_old_garbage_goes(&directory().unwrap(), true);
}

#[test]
fn gc_of_an_s3_remote_takes_only_garbage() {
    let Some(r) = s3() else {
        eprintln!("skipped: s3s-fs is not installed");
        return;
    };
    young_garbage_stays_and_old_garbage_goes(&r, false);
}

#[test]
fn gc_of_an_azure_remote_takes_only_garbage() {
    let Some(r) = azurite() else { return };
    young_garbage_stays_and_old_garbage_goes(&r, false);
}

#[test]
fn gc_of_a_gcs_remote_takes_only_garbage() {
    let Some(r) = gcs() else { return };
    young_garbage_stays_and_old_garbage_goes(&r, false);
}

#[test]
fn gc_refuses_a_git_filter_remote_and_a_remote_without_refs() {
    let r = directory().unwrap();
    let a = trained(&r, 3, 1);
    DirRemote::create(&r.url).unwrap();
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    let empty = r.ckpt(a.path(), &["gc", "--remote", "origin"]);
    assert!(!empty.status.success());
    let message = String::from_utf8_lossy(&empty.stderr);
    assert!(message.contains("no ref"), "{message}");

    r.ok(a.path(), &["push"]);
    let before = object_keys(&r);
    // What the git filter's pre-push writes on a remote it stores objects on.
    std::fs::write(Path::new(&r.url).join(sync::GIT_FILTER_MARKER), "marker\n").unwrap();
    age_objects(&r.objects, Duration::from_secs(2 * 86400));
    let refused = r.ckpt(a.path(), &["gc", "--remote", "origin", "--prune=now"]);
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("git repository"), "{message}");
    assert_eq!(object_keys(&r), before);
}

/// A remote with faults and pauses on demand (each off unless set):
/// - `refs_fail`: ref writes fail (a push that dies before its ref moves);
/// - `gc_after_listing`: `ckpt gc --remote` (default grace) runs on the remote right after the
///   first listing of `objects/` (a gc in the middle of a push);
/// - `pause_deletes`: `(at_delete, go)`: the gc's deletes of objects set `at_delete` and wait
///   (at most 20 s from the first) until `go` is set, so that a writer's uploads land between
///   the gc's listing and its deletes;
/// - `settling`: set when the writer looks at `gc/` the second time (its uploads are done and
///   it settles); with `dies_at_settle`, that look fails instead (the writer dies there);
/// - `interrupt_at_delete`: set by the gc's first delete of an object (Ctrl-C in the middle of
///   the deletes).
#[derive(Default)]
struct Hooks<'a> {
    refs_fail: bool,
    interrupt_at_delete: Option<&'a AtomicBool>,
    gc_after_listing: Option<&'a Repo>,
    pause_deletes: Option<(&'a AtomicBool, &'a AtomicBool)>,
    settling: Option<&'a AtomicBool>,
    dies_at_settle: bool,
}

struct Hooked<'a> {
    inner: Box<dyn Remote>,
    hooks: Hooks<'a>,
    gc_ran: AtomicBool,
    gc_looks: AtomicUsize,
    first_delete: OnceLock<Instant>,
}

impl<'a> Hooked<'a> {
    fn new(inner: Box<dyn Remote>, hooks: Hooks<'a>) -> Hooked<'a> {
        Hooked { inner, hooks, gc_ran: false.into(), gc_looks: 0.into(), first_delete: OnceLock::new() }
    }
}

/// Waits until `flag` is set, at most 20 s from `began`.
fn wait_for(flag: &AtomicBool, began: Instant) {
    while !flag.load(SeqCst) && began.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Remote for Hooked<'_> {
    fn url(&self) -> &str {
        self.inner.url()
    }
    fn list(&self, prefix: &str) -> ckpt::remote::Result<Vec<String>> {
        self.inner.list(prefix)
    }
    fn list_modified(&self, prefix: &str) -> ckpt::remote::Result<Vec<Listed>> {
        if prefix == sync::GC_RECORDS && self.gc_looks.fetch_add(1, SeqCst) == 1 {
            if self.hooks.dies_at_settle {
                return Err(ckpt::remote::Error::NotFound { remote: "killed".into(), key: prefix.into() });
            }
            if let Some(settling) = self.hooks.settling {
                settling.store(true, SeqCst);
            }
        }
        let listed = self.inner.list_modified(prefix)?;
        if let Some(repo) = self.hooks.gc_after_listing.filter(|_| prefix == "objects/") {
            if !self.gc_ran.swap(true, SeqCst) {
                let report = sync::gc_remote(repo, self.inner.as_ref(), &RemoteGcOptions::default()).unwrap();
                assert!(report.deleted > 0, "the gc found the old garbage: {report:?}");
            }
        }
        Ok(listed)
    }
    fn modified(&self, key: &str) -> ckpt::remote::Result<Option<SystemTime>> {
        self.inner.modified(key)
    }
    fn get_small(&self, key: &str) -> ckpt::remote::Result<Option<ckpt::remote::Small>> {
        self.inner.get_small(key)
    }
    fn put_small(&self, key: &str, bytes: &[u8], expect: &ckpt::remote::Expect) -> ckpt::remote::Result<()> {
        if self.hooks.refs_fail && key.starts_with("refs/") {
            return Err(ckpt::remote::Error::Conflict { remote: self.url().into(), key: key.into() });
        }
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
        self.inner.upload(key, file, path, len, mode)
    }
    fn replace(&self, key: &str, file: &std::fs::File, path: &Path, len: u64) -> ckpt::remote::Result<()> {
        self.inner.replace(key, file, path, len)
    }
    fn delete(&self, key: &str) -> ckpt::remote::Result<()> {
        // Every delete (the gc deletes in parallel) waits for the writer.
        if let Some((at_delete, go)) = self.hooks.pause_deletes.filter(|_| key.starts_with("objects/")) {
            at_delete.store(true, SeqCst);
            wait_for(go, *self.first_delete.get_or_init(Instant::now));
        }
        if let Some(interrupt) = self.hooks.interrupt_at_delete.filter(|_| key.starts_with("objects/")) {
            interrupt.store(true, SeqCst);
        }
        self.inner.delete(key)
    }
    fn read_head(&self, key: &str, len: u64) -> ckpt::remote::Result<(Vec<u8>, u64)> {
        self.inner.read_head(key, len)
    }
    fn download(&self, key: &str, out: &mut dyn std::io::Write, limit: u64) -> ckpt::remote::Result<u64> {
        self.inner.download(key, out, limit)
    }
    fn requests(&self) -> u64 {
        self.inner.requests()
    }
}

#[test]
fn a_push_does_not_count_on_old_garbage_a_gc_may_take_meanwhile() {
    // b's dead push left b's objects; a day later b rebases and pushes again. Its listing
    // shows them there, but old and reached by no ref: a gc may delete them at any moment
    // (here: right after the listing), so the push uploads them again.
    let r = directory().unwrap();
    let (a, b, _, garbage) = dead_push(&r);
    age_objects(&r.objects, Duration::from_secs(2 * 86400));
    let b_dir = b.path().join("b");
    r.ok(&b_dir, &["pull", "--rebase"]);

    let repo = Repo::open(&b_dir).unwrap();
    let gc_from = Repo::open(a.path()).unwrap();
    let remote = Hooked::new(open_remote(&r), Hooks { gc_after_listing: Some(&gc_from), ..Hooks::default() });
    let report = sync::push_to(&repo, &remote, &PushOptions { transfers: 4, ..PushOptions::default() }).unwrap();
    assert!(remote.gc_ran.load(SeqCst));
    assert!(report.objects_sent as usize >= garbage.len(), "{report:?}");
    clone_reads(&r, &[("main", model(77, 2)), ("main~1", model(7, 2)), ("main~3", model(7, 0))]);
}

/// b's dead push left garbage a day old; b rebases. A gc (run from a) lists the garbage and,
/// before its deletes, b pushes once per entry of `dies` (the push dies when it settles where
/// the entry is true) on another thread; the gc's deletes wait until a push settles. Returns
/// the gc's report, each push's objects sent (or error) and whether a push settled.
fn gc_with_pushes_in_between(r: &Served, dies: &[bool]) -> (sync::RemoteGcReport, Vec<Result<u64, String>>, bool) {
    let (a, b, _, _) = dead_push(r);
    age_objects(&r.objects, Duration::from_secs(2 * 86400));
    let b_dir = b.path().join("b");
    r.ok(&b_dir, &["pull", "--rebase"]);
    let b_repo = Repo::open(&b_dir).unwrap();
    let gc_from = Repo::open(a.path()).unwrap();
    let (settling, at_delete) = (AtomicBool::new(false), AtomicBool::new(false));
    let pushes = std::sync::Mutex::new(Vec::new());
    let report = std::thread::scope(|scope| {
        let (b_repo, pushes, at_delete, settling) = (&b_repo, &pushes, &at_delete, &settling);
        scope.spawn(move || {
            wait_for(at_delete, Instant::now());
            for &dies_at_settle in dies {
                let hooks = Hooks { settling: Some(settling), dies_at_settle, ..Hooks::default() };
                let writer = Hooked::new(open_remote(r), hooks);
                let report = sync::push_to(b_repo, &writer, &PushOptions { transfers: 4, ..PushOptions::default() });
                pushes.lock().unwrap().push(report.map(|r| r.objects_sent).map_err(|e| e.to_string()));
            }
        });
        let gc_remote =
            Hooked::new(open_remote(r), Hooks { pause_deletes: Some((at_delete, settling)), ..Hooks::default() });
        sync::gc_remote(&gc_from, &gc_remote, &RemoteGcOptions::default()).unwrap()
    });
    assert!(report.deleted > 0, "{report:?}");
    (report, pushes.into_inner().unwrap(), settling.load(SeqCst))
}

#[test]
fn a_push_that_writes_old_objects_again_while_a_gc_deletes_them_waits_and_uploads_them_again() {
    // The gc has listed b's old garbage and is about to delete it when b's push writes the
    // same keys again (it needs them) and would move its ref: the push waits for the gc to
    // finish, finds its keys gone, uploads them again, then moves the ref.
    let r = directory().unwrap();
    let (_, pushes, settled) = gc_with_pushes_in_between(&r, &[false]);
    clone_reads(&r, &[("main", model(77, 2)), ("main~1", model(7, 2)), ("main~3", model(7, 0))]);
    assert!(matches!(pushes[..], [Ok(sent)] if sent > 0), "{pushes:?}");
    assert!(settled, "the push looked for running gcs");
    let records: Vec<String> = std::fs::read_dir(Path::new(&r.url).join("gc"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(records, ["generation"], "the gc's record is gone, its generation stays");
}

#[test]
fn a_clone_behind_the_remote_pushes_a_tag_without_sending_old_objects_again() {
    // b's remote-tracking ref names a version the remote has: what it reaches is counted on
    // however old, though the remote's branch has moved to a version b lacks.
    let r = directory().unwrap();
    let a = trained(&r, 5, 2);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    let b = tempfile::tempdir().unwrap();
    r.ok(b.path(), &["clone", &r.url, "b"]);
    let b_dir = b.path().join("b");
    std::fs::write(a.path().join("model.safetensors"), model(5, 2)).unwrap();
    r.ok(a.path(), &["commit", "-m", "epoch 2", "model.safetensors"]);
    r.ok(a.path(), &["push"]);
    age_objects(&r.objects, Duration::from_secs(2 * 86400));
    r.ok(&b_dir, &["tag", "t1"]);
    let before = object_keys(&r);
    let pushed = json(&r.ok(&b_dir, &["push", "origin", "t1", "--json"]));
    assert_eq!(pushed["objects_sent"], 0, "{pushed}");
    assert_eq!(object_keys(&r), before);
}

#[test]
fn a_rerun_that_counts_on_keys_a_dead_push_wrote_again_settles_them_too() {
    // A gc has listed b's old garbage; b's first push writes those keys again (so they are
    // fresh) and dies before it settles. b's rerun counts on them as fresh, and must still see
    // that a gc was running, wait for it, and upload again what it deleted.
    let r = directory().unwrap();
    let (_, pushes, _) = gc_with_pushes_in_between(&r, &[true, false]);
    clone_reads(&r, &[("main", model(77, 2)), ("main~1", model(7, 2)), ("main~3", model(7, 0))]);
    assert!(matches!(pushes[..], [Err(_), Ok(_)]), "the first push died, the rerun worked: {pushes:?}");
}

#[test]
fn a_push_uploads_every_blob_before_any_manifest_and_every_manifest_before_any_version() {
    // A writer that finds a manifest takes its file as there: a push killed part way must
    // never leave one whose blobs are not all up.
    let r = directory().unwrap();
    let a = trained(&r, 9, 3);
    DirRemote::create(&r.url).unwrap();
    let repo = Repo::open(a.path()).unwrap();
    let remote = crate::support::remote::Recording::create(&r.url);
    sync::push_to(&repo, &remote, &PushOptions { transfers: 4, ..PushOptions::default() }).unwrap();
    let kinds: Vec<ckpt::store::ObjectKind> = remote
        .uploads
        .lock()
        .unwrap()
        .iter()
        .filter_map(|k| ckpt::remote::object_of_key(k))
        .map(|id| repo.store().header(&id).unwrap().kind)
        .collect();
    use ckpt::store::ObjectKind::{Blob, Manifest, Version};
    assert!(kinds.contains(&Blob) && kinds.contains(&Manifest) && kinds.contains(&Version), "{kinds:?}");
    let rank = |k: &ckpt::store::ObjectKind| match k {
        Blob => 0,
        Manifest => 1,
        _ => 2,
    };
    assert!(kinds.windows(2).all(|w| rank(&w[0]) <= rank(&w[1])), "upload order: {kinds:?}");
    assert_eq!(kinds.last(), Some(&Version));
}

/// Interrupted in the middle of its deletes (Ctrl-C sets `RemoteGcOptions::interrupt`), a gc
/// sends no further delete, removes its record (so no writer waits for a dead gc) and reports
/// what it deleted; nothing a ref reaches is touched, and the next gc takes the rest.
#[test]
fn an_interrupted_gc_stops_between_deletes_and_removes_its_record() {
    let r = directory().unwrap();
    let (a, _b, reachable, garbage) = dead_push(&r);
    assert!(garbage.len() >= 2, "{garbage:?}");
    age_objects(&r.objects, Duration::from_secs(2 * 86400));
    let repo = Repo::open(a.path()).unwrap();
    let interrupt = std::sync::Arc::new(AtomicBool::new(false));
    let remote = Hooked::new(open_remote(&r), Hooks { interrupt_at_delete: Some(&interrupt), ..Hooks::default() });
    // One request at a time: the delete that sets the flag is the last one sent.
    let options = RemoteGcOptions { transfers: 1, interrupt: Some(interrupt.clone()), ..RemoteGcOptions::default() };
    let err = sync::gc_remote(&repo, &remote, &options).unwrap_err();
    assert!(matches!(err, sync::Error::RemoteGcInterrupted { deleted: 1, .. }), "{err}");
    assert!(err.to_string().contains("interrupted after 1 deletes"), "{err}");
    let left = object_keys(&r);
    assert_eq!(left.len(), reachable.len() + garbage.len() - 1);
    assert!(reachable.is_subset(&left));
    assert!(!Path::new(&r.url)
        .join("gc")
        .read_dir()
        .unwrap()
        .any(|e| { e.unwrap().file_name().to_string_lossy().starts_with("run-") }));

    let done = json(&r.ok(a.path(), &["gc", "--remote", "origin", "--json"]));
    assert_eq!(done["deleted"].as_u64().unwrap(), garbage.len() as u64 - 1, "{done}");
    assert_eq!(object_keys(&r), reachable);
    clone_reads(&r, &[("main", model(7, 2)), ("main~2", model(7, 0))]);
}

/// `ckpt gc --remote` stopped by SIGINT while it waits for another gc (whose record is live)
/// exits at once with 130, leaving the other's record and writing none of its own.
#[test]
fn ctrl_c_stops_the_gc_command_at_once_with_130_and_no_record_left() {
    let r = directory().unwrap();
    let a = trained(&r, 3, 1);
    r.ok(a.path(), &["remote", "add", "origin", &r.url]);
    r.ok(a.path(), &["push"]);
    let other = Path::new(&r.url).join("gc/run-0123456789abcdef0123456789abcdef");
    std::fs::create_dir_all(other.parent().unwrap()).unwrap();
    std::fs::write(&other, "another gc\n").unwrap();
    let mut gc = crate::support::repo_util::ckpt_command(a.path(), &["gc", "--remote", "origin"])
        .envs(r.env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Signalled once its handler is in place (the caught-signal mask in /proc: a loaded machine
    // may take long to start it); it then waits for the other gc's record to go or die.
    let caught = |pid: u32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:")).unwrap_or("0").trim().to_string();
        u64::from_str_radix(&mask, 16).unwrap_or(0) & (1 << (libc::SIGINT - 1)) != 0
    };
    let began = Instant::now();
    while !caught(gc.id()) {
        assert!(gc.try_wait().unwrap().is_none() && began.elapsed() < Duration::from_secs(60), "gc ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(gc.try_wait().unwrap().is_none(), "still waiting for the other gc");
    let signalled = Instant::now();
    // SAFETY: kill(2) with a child's pid and a valid signal number.
    assert_eq!(unsafe { libc::kill(gc.id() as libc::pid_t, libc::SIGINT) }, 0);
    let out = gc.wait_with_output().unwrap();
    assert!(
        signalled.elapsed() < Duration::from_secs(20),
        "stopped at once, not after 10 minutes: {:?}",
        signalled.elapsed()
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted after 0 deletes"), "{stderr}");
    let records: Vec<_> = std::fs::read_dir(other.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(records, vec![other.file_name().unwrap().to_owned()], "the other's record alone");
}
