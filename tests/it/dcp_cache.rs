//! The cache a rank keeps between saves to a remote (`sync::RankCache`, the default of
//! `ckpt.dcp.Writer("s3://…")`): a save on top of the previous one downloads nothing of the
//! rank's previous file; one process at a time uses a cache (a second falls back to a temporary
//! one, a killed holder blocks nobody); a damaged cache or one of another remote still gives a
//! correct save; pruning keeps one save's objects.

use crate::support::remote::Recording;
use crate::support::repo_util::{read_tree, synthetic_checkpoint};
use ckpt::remote::{self, Remote, S3Options};
use ckpt::repo::{CommitOptions, FileEntry, Repo, RepoPath, VersionId};
use ckpt::sync::{self, Layout, RankCache};
use ckpt::Dtype;
use std::collections::HashSet;

/// Rank `rank`'s file of save `epoch`: tensors large enough that deltas and recodes pay.
fn rank_file(rank: u64, epoch: u32) -> Vec<u8> {
    let shapes: &[(&str, &[u64])] = &[("w.a", &[128, 256]), ("w.b", &[256, 64]), ("bias", &[64])];
    synthetic_checkpoint(10 + rank, Dtype::F32, shapes, epoch)
}

const PATH: &str = "__0_0.distcp";

struct Setup {
    work: tempfile::TempDir,
    url: String,
    remote: Recording,
}

impl Setup {
    fn new() -> Setup {
        let work = tempfile::tempdir().unwrap();
        let url = work.path().join("remote").to_str().unwrap().to_string();
        let remote = Recording::create(&url);
        Setup { work, url, remote }
    }

    fn root(&self) -> std::path::PathBuf {
        self.work.path().join("caches")
    }

    /// Rank 0's kept cache of this remote.
    fn kept(&self) -> RankCache {
        RankCache::kept(&self.root(), self.remote.url(), 0).unwrap()
    }

    /// One save by rank 0 through `cache`, committed by a coordinator with a cache of its
    /// own; the rank's kept cache is pruned after it, as the Writer does.
    fn save(&self, cache: &RankCache, epoch: u32, layout: Layout) -> VersionId {
        let tip = sync::remote_branch_tip(&self.remote, "main").unwrap();
        let stored = self.store(cache, epoch, layout, &tip).unwrap();
        cache.note_file(PATH, stored.entry.manifest);
        let coordinator = RankCache::temporary().unwrap();
        let options = CommitOptions::default();
        let entries: Vec<FileEntry> = vec![stored.entry];
        let id = sync::commit_to_remote(
            &coordinator.repo(),
            &self.remote,
            sync::RemoteCommit {
                branch: "main",
                tip: &tip,
                files: entries,
                stored_bytes: 0,
                message: "s",
                tags: &[],
                options: &options,
            },
        )
        .unwrap();
        cache.prune().unwrap();
        id
    }

    /// Rank 0's upload of its file of `epoch` through `cache`, on top of `tip`.
    fn store(
        &self,
        cache: &RankCache,
        epoch: u32,
        layout: Layout,
        tip: &sync::RemoteTip,
    ) -> sync::Result<sync::RemoteFile> {
        let disk = self.work.path().join("spool");
        std::fs::write(&disk, rank_file(0, epoch)).unwrap();
        let path = RepoPath::parse(PATH).unwrap();
        sync::store_file_to_remote(
            &cache.repo(),
            &self.remote,
            &sync::FileUpload {
                disk: &disk,
                path: &path,
                previous: tip.version.as_ref(),
                written: None,
                layout,
                transfers: 4,
            },
        )
    }

    /// Every version of `saves` checks out of a clone as rank 0's file of its epoch.
    fn assert_clone_reads(&self, saves: &[(VersionId, u32)]) {
        let dir = tempfile::tempdir_in(self.work.path()).unwrap();
        let (clone, _) = sync::clone_from(&self.url, &dir.path().join("clone"), S3Options::default(), 4, None).unwrap();
        assert!(clone.verify().unwrap().is_ok());
        for (id, epoch) in saves {
            let out = tempfile::tempdir_in(self.work.path()).unwrap();
            clone.checkout(&id.to_hex(), None, Some(out.path()), None).unwrap();
            assert!(read_tree(out.path()) == vec![(PATH.to_string(), rank_file(0, *epoch))], "epoch {epoch}");
        }
    }

    /// The object keys of rank 0's file in version `id`: its manifest and blobs.
    fn file_keys(&self, id: &VersionId) -> HashSet<String> {
        let reader = RankCache::temporary().unwrap();
        let repo = reader.repo();
        let entry = sync::fetch_stored_file(&repo, &self.remote.inner, id, PATH).unwrap();
        let manifest = repo.manifest(&entry.manifest).unwrap();
        std::iter::once(entry.manifest).chain(manifest.blobs()).map(|id| remote::object_key(&id)).collect()
    }
}

/// Bytes and count of the object files of a cache's store.
fn store_size(repo: &Repo) -> (usize, u64) {
    let ids = repo.store().list().unwrap();
    (ids.len(), ids.iter().map(|id| repo.store().stored_len(id).unwrap()).sum())
}

#[test]
fn a_save_on_top_of_the_previous_one_downloads_nothing_of_its_file_from_a_kept_cache() {
    for layout in [Layout::Mirror, Layout::Deltas] {
        let s = Setup::new();
        let v1 = s.save(&s.kept(), 1, layout);
        let first = s.file_keys(&v1);
        s.remote.take_downloads();

        // Kept: nothing of the previous file (the version object itself is small; the deltas
        // layout reads the header of each reference on the remote, for its chain depth there).
        let v2 = s.save(&s.kept(), 2, layout);
        let downloads = s.remote.take_downloads();
        let refetched: Vec<_> = downloads.iter().filter(|(k, bytes)| first.contains(k) && *bytes > 72).collect();
        assert!(refetched.is_empty(), "{layout}: {refetched:?} of {downloads:?}");
        // What it replaces: a temporary cache downloads the previous file's manifest and blobs.
        let v3 = s.save(&RankCache::temporary().unwrap(), 3, layout);
        let second = s.file_keys(&v2);
        let downloads = s.remote.take_downloads();
        let refetched = downloads.iter().filter(|(k, bytes)| second.contains(k) && *bytes > 72).count();
        assert!(refetched >= 2, "{layout}: {downloads:?}");

        s.assert_clone_reads(&[(v1, 1), (v2, 2), (v3, 3)]);
    }
}

#[test]
fn pruning_keeps_a_kept_cache_to_one_save_of_the_rank() {
    let s = Setup::new();
    let mut saves = Vec::new();
    let mut sizes = Vec::new();
    for epoch in 1..=5 {
        let cache = s.kept();
        saves.push((s.save(&cache, epoch, Layout::Deltas), epoch));
        sizes.push(store_size(&cache.repo()));
        // What is left is exactly the newest file with its blobs (and the cache's own root
        // version): the next save's pairs.
        let repo = cache.repo();
        let manifest =
            sync::fetch_version(&repo, &s.remote, &saves.last().unwrap().0).unwrap().file(PATH).unwrap().manifest;
        assert!(repo.verify().unwrap().is_ok());
        let blobs = repo.manifest(&manifest).unwrap().blobs().collect::<HashSet<_>>().len();
        assert_eq!(sizes.last().unwrap().0, blobs + 2, "epoch {epoch}: the blobs, the manifest, the root version");
    }
    // Bounded: the fifth save's cache is no larger than the first's, give or take a version.
    let (first, last) = (sizes[0].1, sizes[4].1);
    assert!(last <= first + first / 10, "{sizes:?}");
    s.assert_clone_reads(&saves);
}

#[test]
fn a_held_cache_is_not_shared_and_a_released_one_is_used_again() {
    let s = Setup::new();
    let first = s.kept();
    assert!(first.is_kept() && first.fallback().is_none());
    // A second user at the same time (here: the same process) gets a temporary cache, and
    // both save correctly.
    let second = s.kept();
    assert!(!second.is_kept());
    assert!(second.fallback().unwrap().contains("in use"), "{:?}", second.fallback());
    assert_ne!(first.dir(), second.dir());
    let v1 = s.save(&first, 1, Layout::Mirror);
    let v2 = s.save(&second, 2, Layout::Mirror);
    let temporary = second.dir();
    drop(second);
    assert!(!temporary.exists(), "a temporary cache is deleted when dropped");
    drop(first);
    assert!(s.kept().is_kept());
    s.assert_clone_reads(&[(v1, 1), (v2, 2)]);
}

#[test]
fn a_killed_holder_of_a_cache_blocks_nobody() {
    let s = Setup::new();
    drop(s.kept());
    let lock = sync::rank_cache_dir(&s.root(), s.remote.url(), 0).join("lock");
    // Another process takes the lock (as a rank mid-save holds it), then is killed.
    let script = "import fcntl, sys, time\nf = open(sys.argv[1], 'a')\nfcntl.flock(f, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n";
    let Ok(mut holder) = std::process::Command::new("python3")
        .args(["-c", script, lock.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .spawn()
    else {
        eprintln!("skipped: python3 is not available to hold the lock");
        return;
    };
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(holder.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "held");
    let blocked = s.kept();
    assert!(!blocked.is_kept(), "the cache was shared with a process holding it");
    holder.kill().unwrap();
    holder.wait().unwrap();
    let after = s.kept();
    assert!(after.is_kept(), "{:?}", after.fallback());
}

#[test]
fn a_damaged_cache_or_one_of_another_remote_still_gives_correct_saves() {
    for layout in [Layout::Mirror, Layout::Deltas] {
        let s = Setup::new();
        let v1 = s.save(&s.kept(), 1, layout);
        // Damage every blob of the kept file in its payload (past the header, as a bad disk
        // would): the save pairs against them, finds the damage and is done again on a rebuilt
        // cache (as `ckpt._native.RemoteStore` does).
        {
            let cache = s.kept();
            let repo = cache.repo();
            for id in repo.store().list().unwrap() {
                let path = repo.store().object_path(&id);
                let mut bytes = std::fs::read(&path).unwrap();
                if bytes.len() > 4096 {
                    let at = bytes.len() - 100;
                    bytes[at] ^= 0x40;
                    std::fs::write(&path, bytes).unwrap();
                }
            }
        }
        let cache = s.kept();
        let tip = sync::remote_branch_tip(&s.remote, "main").unwrap();
        let disk = s.work.path().join("spool2");
        std::fs::write(&disk, rank_file(0, 2)).unwrap();
        let attempts = std::sync::atomic::AtomicU32::new(0);
        let stored = cache
            .with_rebuild(|repo: &Repo| {
                attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let path = RepoPath::parse(PATH).unwrap();
                sync::store_file_to_remote(
                    repo,
                    &s.remote,
                    &sync::FileUpload {
                        disk: &disk,
                        path: &path,
                        previous: tip.version.as_ref(),
                        written: None,
                        layout,
                        transfers: 4,
                    },
                )
            })
            .unwrap();
        assert_eq!(attempts.into_inner(), 2, "{layout}: the damage went unnoticed");
        let coordinator = RankCache::temporary().unwrap();
        let v2 = sync::commit_to_remote(
            &coordinator.repo(),
            &s.remote,
            sync::RemoteCommit {
                branch: "main",
                tip: &tip,
                files: vec![stored.entry],
                stored_bytes: 0,
                message: "2",
                tags: &[],
                options: &CommitOptions::default(),
            },
        )
        .unwrap();
        drop(cache);

        // The cache of this remote, moved where another remote's cache lives: emptied when
        // opened for that remote, whose saves are then correct.
        let other = Setup::new();
        let from = sync::rank_cache_dir(&s.root(), s.remote.url(), 0);
        let to = sync::rank_cache_dir(&other.root(), other.remote.url(), 0);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::rename(&from, &to).unwrap();
        let moved = other.kept();
        assert!(moved.is_kept());
        assert_eq!(store_size(&moved.repo()).0, 0, "{layout}: another remote's objects were kept");
        let w1 = other.save(&moved, 4, layout);
        drop(moved);
        let w2 = other.save(&other.kept(), 5, layout);

        s.assert_clone_reads(&[(v1, 1), (v2, 2)]);
        other.assert_clone_reads(&[(w1, 4), (w2, 5)]);
    }
}

#[test]
fn a_save_deletes_the_journal_its_rank_left_in_a_save_that_stopped_mid_way() {
    let s = Setup::new();
    let v1 = s.save(&s.kept(), 1, Layout::Mirror);
    let tip = sync::remote_branch_tip(&s.remote, "main").unwrap();
    // A mirror save stopped in its recodes (as if killed): its journal stays on the remote.
    s.remote.fail_recodes.store(true, std::sync::atomic::Ordering::Relaxed);
    let cache = s.kept();
    assert!(s.store(&cache, 2, Layout::Mirror, &tip).is_err());
    drop(cache);
    s.remote.fail_recodes.store(false, std::sync::atomic::Ordering::Relaxed);
    let left = s.remote.list("pending/").unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    // That save left no version; the rank's next save deletes its journal (a later push must
    // not recode the first save's blobs against blobs no version names).
    let v2 = s.save(&s.kept(), 3, Layout::Mirror);
    assert!(s.remote.list("pending/").unwrap().is_empty());
    s.assert_clone_reads(&[(v1, 1), (v2, 3)]);
}
