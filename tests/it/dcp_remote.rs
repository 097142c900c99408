//! Versions written straight to a remote by ranks without a repository (`ckpt.dcp.Writer` with
//! a remote target): each rank stores and uploads its own file through a cache of its own
//! (`sync::store_file_to_remote`), one writer lists them in a version and moves the remote
//! branch by compare-and-swap (`sync::commit_to_remote`). What lands is what `clone` reads,
//! bit for bit, in either layout; a second save that began on the same tip is refused; byte
//! ranges read back through `sync::StoredFileReader` are the file's bytes.

use crate::support::remote::Recording;
use crate::support::repo_util::{read_tree, synthetic_checkpoint, Files};
use ckpt::remote::{local::DirRemote, Remote, S3Options};
use ckpt::repo::{CommitOptions, FileEntry, Repo, RepoPath, VersionId};
use ckpt::sync::{self, Layout, RemoteFile, RemoteTip};
use ckpt::torch_zip::dcp;
use ckpt::Dtype;
use std::path::Path;

/// Two ranks' files of one save: large enough tensors that deltas and recodes pay.
fn rank_files(epoch: u32) -> Files {
    let shapes: &[(&str, &[u64])] = &[("w.a", &[128, 256]), ("w.b", &[256, 64]), ("bias", &[64])];
    (0..2)
        .map(|rank| (format!("__{rank}_0.distcp"), synthetic_checkpoint(10 + rank, Dtype::F32, shapes, epoch)))
        .collect()
}

/// One rank: a cache of its own, its file stored and uploaded against `previous`.
fn save_rank(
    work: &Path,
    remote: &dyn Remote,
    path: &str,
    bytes: &[u8],
    previous: Option<&VersionId>,
    layout: Layout,
) -> (FileEntry, sync::FileTransfer) {
    let cache_dir = tempfile::tempdir_in(work).unwrap();
    let cache = Repo::init(cache_dir.path()).unwrap();
    let disk = cache_dir.path().join("spool");
    std::fs::write(&disk, bytes).unwrap();
    let stored = sync::store_file_to_remote(
        &cache,
        remote,
        &sync::FileUpload {
            disk: &disk,
            path: &RepoPath::parse(path).unwrap(),
            previous,
            written: None,
            layout,
            transfers: 4,
        },
    )
    .unwrap();
    (stored.entry, stored.transfer)
}

/// A save of `files` on `branch` by one process per rank plus a coordinator, all starting
/// from `tip`.
fn save(
    work: &Path,
    remote: &dyn Remote,
    tip: &RemoteTip,
    files: &[(String, Vec<u8>)],
    layout: Layout,
) -> (sync::Result<VersionId>, Vec<sync::FileTransfer>) {
    let mut entries = Vec::new();
    let mut transfers = Vec::new();
    for (path, bytes) in files {
        let (entry, transfer) = save_rank(work, remote, path, bytes, tip.version.as_ref(), layout);
        entries.push(entry);
        transfers.push(transfer);
    }
    let coordinator = tempfile::tempdir_in(work).unwrap();
    let cache = Repo::init(coordinator.path()).unwrap();
    let id = sync::commit_to_remote(
        &cache,
        remote,
        sync::RemoteCommit {
            branch: "main",
            tip,
            files: entries,
            stored_bytes: 0,
            message: "save",
            tags: &[],
            options: &CommitOptions::default(),
        },
    );
    (id, transfers)
}

/// Every version of `expected` checks out of a clone of `url` as those bytes.
fn assert_clone_reads(work: &Path, url: &str, expected: &[(VersionId, Files)]) {
    let dir = tempfile::tempdir_in(work).unwrap();
    let (clone, _) = sync::clone_from(url, &dir.path().join("clone"), S3Options::default(), 4, None).unwrap();
    assert!(clone.verify().unwrap().is_ok());
    for (id, files) in expected {
        let out = tempfile::tempdir_in(work).unwrap();
        clone.checkout(&id.to_hex(), None, Some(out.path()), None).unwrap();
        assert_eq!(read_tree(out.path()), *files, "version {id} after a clone");
    }
}

#[test]
fn ranks_without_a_repository_save_versions_a_clone_reads_in_both_layouts() {
    for layout in [Layout::Mirror, Layout::Deltas] {
        let work = tempfile::tempdir().unwrap();
        let url = work.path().join("remote").to_str().unwrap().to_string();
        let remote = DirRemote::create(&url).unwrap();

        let tip = sync::remote_branch_tip(&remote, "main").unwrap();
        assert_eq!((tip.version, &tip.tag), (None, &None));
        assert!(tip.read_at.is_some(), "the read is timed, for the commit's deadline");
        let first = rank_files(1);
        let (v1, _) = save(work.path(), &remote, &tip, &first, layout);
        let v1 = v1.unwrap();
        assert_eq!(sync::resolve_remote(&remote, "HEAD").unwrap(), v1);

        let tip = sync::remote_branch_tip(&remote, "main").unwrap();
        assert_eq!(tip.version, Some(v1));
        let second = rank_files(2);
        let (v2, transfers) = save(work.path(), &remote, &tip, &second, layout);
        let v2 = v2.unwrap();
        // Each rank coded against its own file of the previous save: mirror recodes the
        // previous blobs on the remote, deltas sends the new ones as deltas.
        let (recoded, as_deltas): (u64, u64) =
            transfers.iter().fold((0, 0), |(r, d), t| (r + t.objects_recoded, d + t.objects_as_deltas));
        match layout {
            Layout::Mirror => assert!(recoded >= 2 && as_deltas == 0, "{layout}: {transfers:?}"),
            Layout::Deltas => assert!(as_deltas >= 2 && recoded == 0, "{layout}: {transfers:?}"),
        }
        assert_eq!(sync::resolve_remote(&remote, "main").unwrap(), v2);
        assert_eq!(sync::resolve_remote(&remote, &v1.to_hex()).unwrap(), v1);
        // No journal is left behind.
        assert!(remote.list("pending/").unwrap().is_empty());

        let mut sorted = [first, second];
        for files in &mut sorted {
            files.sort();
        }
        let [first, second] = sorted;
        assert_clone_reads(work.path(), &url, &[(v1, first), (v2, second)]);
    }
}

#[test]
fn a_second_save_that_began_on_the_same_tip_is_refused_and_overwrites_nothing() {
    let work = tempfile::tempdir().unwrap();
    let url = work.path().join("remote").to_str().unwrap().to_string();
    let remote = DirRemote::create(&url).unwrap();
    let (v1, _) = save(
        work.path(),
        &remote,
        &RemoteTip { version: None, tag: None, read_at: None },
        &rank_files(1),
        Layout::Mirror,
    );
    let v1 = v1.unwrap();
    let tip = sync::remote_branch_tip(&remote, "main").unwrap();

    // Two jobs read the same tip; the first to finish wins.
    let (won, _) = save(work.path(), &remote, &tip, &rank_files(2), Layout::Mirror);
    let won = won.unwrap();
    let (lost, _) = save(work.path(), &remote, &tip, &rank_files(3), Layout::Mirror);
    match lost {
        Err(sync::Error::Rejected { reason, .. }) => assert!(reason.contains("another save"), "{reason}"),
        other => panic!("the second save was not refused: {other:?}"),
    }
    assert_eq!(sync::resolve_remote(&remote, "main").unwrap(), won);
    let mut files = rank_files(2);
    files.sort();
    assert_clone_reads(work.path(), &url, &[(won, files)]);
    let _ = v1;
}

#[test]
fn a_version_lists_only_complete_files_and_new_tags() {
    let work = tempfile::tempdir().unwrap();
    let url = work.path().join("remote").to_str().unwrap().to_string();
    let remote = DirRemote::create(&url).unwrap();
    let none = RemoteTip { version: None, tag: None, read_at: None };
    let (entry, _) = save_rank(work.path(), &remote, "__0_0.distcp", &rank_files(1)[0].1, None, Layout::Mirror);
    let cache_dir = tempfile::tempdir_in(work.path()).unwrap();
    let cache = Repo::init(cache_dir.path()).unwrap();
    let options = CommitOptions::default();

    // A file whose manifest never reached the remote.
    let mut missing = entry.clone();
    missing.path = "__1_0.distcp".into();
    missing.manifest = ckpt::ObjectId::hash(b"not uploaded");
    let refused = sync::commit_to_remote(
        &cache,
        &remote,
        sync::RemoteCommit {
            branch: "main",
            tip: &none,
            files: vec![entry.clone(), missing],
            stored_bytes: 0,
            message: "m",
            tags: &[],
            options: &options,
        },
    );
    assert!(refused.is_err());
    assert_eq!(sync::remote_branch_tip(&remote, "main").unwrap().version, None);

    let tags = vec!["step-1".to_string()];
    let v1 = sync::commit_to_remote(
        &cache,
        &remote,
        sync::RemoteCommit {
            branch: "main",
            tip: &none,
            files: vec![entry.clone()],
            stored_bytes: 0,
            message: "m",
            tags: &tags,
            options: &options,
        },
    )
    .unwrap();
    assert_eq!(sync::resolve_remote(&remote, "step-1").unwrap(), v1);
    // A tag that exists: refused before the branch moves.
    let tip = sync::remote_branch_tip(&remote, "main").unwrap();
    let again = sync::commit_to_remote(
        &cache,
        &remote,
        sync::RemoteCommit {
            branch: "main",
            tip: &tip,
            files: vec![entry],
            stored_bytes: 0,
            message: "m",
            tags: &tags,
            options: &options,
        },
    );
    assert!(matches!(again, Err(sync::Error::Rejected { .. })), "{again:?}");
    assert_eq!(sync::remote_branch_tip(&remote, "main").unwrap().tag, tip.tag);
}

#[test]
fn byte_ranges_of_a_stored_file_are_its_bytes() {
    let work = tempfile::tempdir().unwrap();
    let url = work.path().join("remote").to_str().unwrap().to_string();
    let remote = DirRemote::create(&url).unwrap();
    let files = rank_files(1);
    let (v1, _) =
        save(work.path(), &remote, &RemoteTip { version: None, tag: None, read_at: None }, &files, Layout::Deltas);
    let v1 = v1.unwrap();

    // A reader's cache downloads only the file it reads.
    let cache_dir = tempfile::tempdir_in(work.path()).unwrap();
    let cache = Repo::init(cache_dir.path()).unwrap();
    let (path, bytes) = &files[1];
    let entry = sync::fetch_stored_file(&cache, &remote, &v1, path).unwrap();
    let other = sync::fetch_version(&cache, &remote, &v1).unwrap().file(&files[0].0).unwrap().manifest;
    assert!(!cache.store().contains(&other));

    let mut reader = sync::StoredFileReader::open(&cache, &entry.manifest).unwrap();
    assert_eq!(reader.len(), bytes.len() as u64);
    let n = bytes.len() as u64;
    for (offset, len) in [(0, n), (0, 0), (1, 100), (n / 3, n / 3), (n - 7, 7), (n, 0), (100, n / 2)] {
        let got = reader.read(&cache, offset, len).unwrap();
        assert!(got == bytes[offset as usize..(offset + len) as usize], "bytes {offset}+{len}");
    }
    assert!(reader.read(&cache, n - 1, 2).is_err());
    assert!(reader.read(&cache, u64::MAX, 2).is_err());
}

/// A DCP fixture directory (tests/fixtures/dcp/): `.metadata` and the rank files.
fn dcp_fixture(name: &str) -> Files {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dcp").join(name);
    let mut files: Files = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().into_string().unwrap(), std::fs::read(e.path()).unwrap())
        })
        .collect();
    files.sort();
    files
}

/// What a Writer rank reports having written into rank file `name` of fixture `files`.
fn report(files: &Files, name: &str) -> Vec<dcp::Item> {
    let metadata = &files.iter().find(|(n, _)| n == ".metadata").unwrap().1;
    dcp::parse_metadata(metadata).unwrap().items_in(name).cloned().collect()
}

#[test]
fn ranks_pair_items_with_any_file_of_the_previous_save_downloading_only_what_pairs() {
    let (e1, e2) = (dcp_fixture("mlp_2ranks_epoch1"), dcp_fixture("mlp_2ranks_epoch2"));
    let get = |files: &Files, n: &str| files.iter().find(|(p, _)| p == n).unwrap().1.clone();
    for (layout, swapped) in [(Layout::Deltas, false), (Layout::Deltas, true), (Layout::Mirror, true)] {
        let work = tempfile::tempdir().unwrap();
        let url = work.path().join("remote").to_str().unwrap().to_string();
        let remote = Recording::create(&url);
        // Save 1, each rank's file cut by its report.
        let mut entries = Vec::new();
        for (name, bytes) in &e1 {
            let items = name.ends_with(".distcp").then(|| report(&e1, name));
            entries.push(save_reported(work.path(), &remote, name, bytes, None, items, layout).0);
        }
        let stored: u64 = entries.iter().map(|f| f.stored_bytes).sum();
        let entries: Vec<FileEntry> = entries.into_iter().map(|f| f.entry).collect();
        let none = RemoteTip { version: None, tag: None, read_at: None };
        let cache = Repo::init(&work.path().join("coordinator")).unwrap();
        let v1 = sync::commit_to_remote(
            &cache,
            &remote,
            sync::RemoteCommit {
                branch: "main",
                tip: &none,
                files: entries,
                stored_bytes: stored,
                message: "1",
                tags: &[],
                options: &Default::default(),
            },
        )
        .unwrap();
        let old = sync::fetch_version(&cache, &remote, &v1).unwrap();
        // What the ranks' uploads created: every object of the first save but the version.
        let objects = |dir: &Path| -> u64 {
            std::fs::read_dir(dir.join("objects"))
                .unwrap()
                .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
                .map(|f| f.unwrap().metadata().unwrap().len())
                .sum()
        };
        let version_len = cache.store().stored_len(&v1).unwrap();
        assert_eq!(old.stored_bytes, stored);
        assert_eq!(stored + version_len, objects(Path::new(&url)), "{layout}");
        let manifest_key = |path: &str| ckpt::remote::object_key(&old.file(path).unwrap().manifest);

        // Save 2, rank 0 only: its file holds rank 1's items when `swapped` (DCP's
        // de-duplication or a new sharding moved them), else its own.
        let source = if swapped { "__1_0.distcp" } else { "__0_0.distcp" };
        remote.downloads.lock().unwrap().clear();
        let (RemoteFile { entry, transfer, .. }, rank) = save_reported(
            work.path(),
            &remote,
            "__0_0.distcp",
            &get(&e2, source),
            Some(&v1),
            Some(report(&e2, source)),
            layout,
        );
        let downloads = remote.downloaded_keys();
        // Only the manifests pairing needs: the same path's, and the other file's only when
        // that leaves items unpaired.
        assert!(downloads.contains(&manifest_key("__0_0.distcp")), "{downloads:?}");
        assert_eq!(downloads.contains(&manifest_key("__1_0.distcp")), swapped, "{downloads:?}");
        // Only blobs of paired items (at most one per new blob), never a whole other file.
        let new = rank.manifest(&entry.manifest).unwrap();
        let old_blobs: std::collections::HashSet<String> = ["__0_0.distcp", "__1_0.distcp"]
            .iter()
            .flat_map(|p| {
                let entry = sync::fetch_stored_file(&cache, &remote.inner, &v1, p).unwrap();
                cache.manifest(&entry.manifest).unwrap().blobs().collect::<Vec<_>>()
            })
            .map(|b| ckpt::remote::object_key(&b))
            .collect();
        // (The deltas layout also reads each reference's header on the remote.)
        let blobs: std::collections::HashSet<&String> = downloads.iter().filter(|k| old_blobs.contains(*k)).collect();
        assert!(!blobs.is_empty() && blobs.len() <= new.blobs().count(), "{layout} {swapped}: {blobs:?}");
        // Coded against them as deltas on the wire (a mirror's recodes need blobs larger
        // than these fixtures' to pay: the torch suite covers them).
        if layout == Layout::Deltas {
            assert!(transfer.objects_as_deltas > 0, "{layout} {swapped}: {transfer:?}");
        }
        let names: Vec<String> = new.tensors().map(|(t, _)| t.name.clone()).collect();
        let wanted = if swapped { "model.fc1.weight[16:32,0:8]" } else { "model.fc1.weight[0:16,0:8]" };
        assert!(names.iter().any(|n| n == wanted), "{names:?}");
        if swapped && layout == Layout::Deltas {
            // Both saves read back bit-exactly from the remote alone (chains across files).
            let tip = sync::remote_branch_tip(&remote, "main").unwrap();
            let v2 = sync::commit_to_remote(
                &cache,
                &remote,
                sync::RemoteCommit {
                    branch: "main",
                    tip: &tip,
                    files: vec![entry],
                    stored_bytes: 0,
                    message: "2",
                    tags: &[],
                    options: &Default::default(),
                },
            )
            .unwrap();
            let reader = Repo::init(&work.path().join("reader")).unwrap();
            for (v, path, bytes) in
                [(v1, "__1_0.distcp", get(&e1, "__1_0.distcp")), (v2, "__0_0.distcp", get(&e2, source))]
            {
                let entry = sync::fetch_stored_file(&reader, &remote.inner, &v, path).unwrap();
                let mut file = sync::StoredFileReader::open(&reader, &entry.manifest).unwrap();
                assert!(file.read(&reader, 0, bytes.len() as u64).unwrap() == bytes, "{layout}: {path} of {v}");
            }
            assert!(reader.verify().unwrap().is_ok());
        }
    }
}

/// [`save_rank`] with the rank's report of its items; also returns the rank's cache.
fn save_reported(
    work: &Path,
    remote: &dyn Remote,
    path: &str,
    bytes: &[u8],
    previous: Option<&VersionId>,
    items: Option<Vec<dcp::Item>>,
    layout: Layout,
) -> (RemoteFile, Repo) {
    let cache_dir = tempfile::tempdir_in(work).unwrap().keep();
    let cache = Repo::init(&cache_dir).unwrap();
    let disk = cache_dir.join("spool");
    std::fs::write(&disk, bytes).unwrap();
    let stored = sync::store_file_to_remote(
        &cache,
        remote,
        &sync::FileUpload {
            disk: &disk,
            path: &RepoPath::parse(path).unwrap(),
            previous,
            written: items.as_deref(),
            layout,
            transfers: 4,
        },
    )
    .unwrap();
    (stored, cache)
}

/// A mirror save recodes the previous version's blobs on the remote as deltas against its new
/// ones, but not those another branch's tip holds (as `ckpt push` spares them): a clone of that
/// branch still finds its newest version whole. Without the other branch the same save recodes.
#[test]
fn a_mirror_save_leaves_the_blobs_of_another_branchs_tip_whole() {
    for other_branch in [false, true] {
        let work = tempfile::tempdir().unwrap();
        let url = work.path().join("remote").to_str().unwrap().to_string();
        let remote = DirRemote::create(&url).unwrap();
        let tip = sync::remote_branch_tip(&remote, "main").unwrap();
        let (v1, _) = save(work.path(), &remote, &tip, &rank_files(1), Layout::Mirror);
        let v1 = v1.unwrap();
        if other_branch {
            // `exp` holds the same content as v1 in a version of its own.
            let exp_tip = sync::remote_branch_tip(&remote, "exp").unwrap();
            let coordinator = tempfile::tempdir_in(work.path()).unwrap();
            let cache = Repo::init(coordinator.path()).unwrap();
            let entries: Vec<FileEntry> = rank_files(1)
                .iter()
                .map(|(path, bytes)| save_rank(work.path(), &remote, path, bytes, None, Layout::Mirror).0)
                .collect();
            sync::commit_to_remote(
                &cache,
                &remote,
                sync::RemoteCommit {
                    branch: "exp",
                    tip: &exp_tip,
                    files: entries,
                    stored_bytes: 0,
                    message: "exp",
                    tags: &[],
                    options: &CommitOptions::default(),
                },
            )
            .unwrap();
        }
        let tip = sync::remote_branch_tip(&remote, "main").unwrap();
        assert_eq!(tip.version, Some(v1));
        let (v2, transfers) = save(work.path(), &remote, &tip, &rank_files(2), Layout::Mirror);
        v2.unwrap();
        let recoded: u64 = transfers.iter().map(|t| t.objects_recoded).sum();
        if other_branch {
            assert_eq!(recoded, 0, "exp's tip holds every blob of v1: {transfers:?}");
        } else {
            assert!(recoded >= 2, "{transfers:?}");
        }
    }
}

/// A rank's save costs requests for its own objects only, however long the remote's history:
/// it never lists the remote's objects (a listing is a request per thousand objects of every
/// earlier save, and refused past millions), in either layout, and still codes against the
/// previous save (recodes or deltas on the wire). A save retried after a failed one (its
/// objects uploaded, no version) finds its large blob with one request and does not send it
/// again. Every version reads back bit-exact from a clone.
#[test]
fn a_rank_save_never_lists_the_remotes_objects() {
    // Safetensors files (tensors without DCP's items; paired by path): one tensor large
    // enough (2 MiB) to be looked for before its upload.
    let shapes: &[(&str, &[u64])] = &[("w.a", &[128, 256]), ("w.big", &[1024, 512]), ("bias", &[64])];
    let files = |epoch: u32| -> Files {
        let mut files: Files = (0..2)
            .map(|rank| (format!("rank{rank}.safetensors"), synthetic_checkpoint(30 + rank, Dtype::F32, shapes, epoch)))
            .collect();
        files.sort();
        files
    };
    for layout in [Layout::Mirror, Layout::Deltas] {
        let work = tempfile::tempdir().unwrap();
        let url = work.path().join("remote").to_str().unwrap().to_string();
        let remote = Recording::create(&url);
        let mut expected = Vec::new();
        for epoch in 1..=3 {
            let tip = sync::remote_branch_tip(&remote, "main").unwrap();
            let (v, transfers) = save(work.path(), &remote, &tip, &files(epoch), layout);
            if epoch > 1 {
                let coded: u64 = transfers.iter().map(|t| t.objects_recoded + t.objects_as_deltas).sum();
                assert!(coded >= 2, "{layout}, epoch {epoch}: {transfers:?}");
            }
            expected.push((v.unwrap(), files(epoch)));
        }
        // Save 4 fails after rank 0 uploaded its file (no version), then is retried with the
        // same tensors in a file whose header differs (another manifest).
        let tip = sync::remote_branch_tip(&remote, "main").unwrap();
        let (path, bytes) = files(4).swap_remove(0);
        save_rank(work.path(), &remote, &path, &bytes, tip.version.as_ref(), layout);
        let mut retried = files(4);
        let at = bytes.windows(11).position(|w| w == br#""epoch":"4""#).unwrap() + 9;
        retried[0].1[at] = b'5';
        remote.uploads.lock().unwrap().clear();
        let (v4, _) = save(work.path(), &remote, &tip, &retried, layout);
        expected.push((v4.unwrap(), retried));
        let cache = Repo::init(&work.path().join("reader")).unwrap();
        let entry = sync::fetch_stored_file(&cache, &remote.inner, &expected[3].0, &path).unwrap();
        let manifest = cache.manifest(&entry.manifest).unwrap();
        let (_, segment) = manifest.tensors().max_by_key(|(_, s)| s.len).unwrap();
        let big = segment.blob.unwrap();
        let uploads = remote.uploads.lock().unwrap().clone();
        assert!(uploads.contains(&ckpt::remote::object_key(&entry.manifest)), "{layout}: {uploads:?}");
        assert!(!uploads.contains(&ckpt::remote::object_key(&big)), "{layout}: {uploads:?}");

        let lists = remote.lists.lock().unwrap().clone();
        assert!(!lists.iter().any(|p| p.starts_with("objects")), "{layout}: {lists:?}");
        assert_clone_reads(work.path(), &url, &expected);
    }
}

/// Two ranks whose tensors trade contents between saves: each rank's new blob is the other
/// rank's blob of the previous save, already on the remote, so neither recodes against it (run
/// at once, the two recodes would make each blob a delta against the other: a cycle no read
/// could resolve). Both versions read back bit-exact.
#[test]
fn a_mirror_save_does_not_recode_against_a_blob_the_remote_already_holds() {
    let shapes: &[(&str, &[u64])] = &[("w", &[256, 256])];
    // One tensor's values at two epochs: close enough that a delta between them pays.
    let content = |epoch: u32| synthetic_checkpoint(7, Dtype::F32, shapes, epoch);
    let (c1, c2) = (content(1), content(2));
    let work = tempfile::tempdir().unwrap();
    let url = work.path().join("remote").to_str().unwrap().to_string();
    let remote = Recording::create(&url);
    let mut expected = Vec::new();
    for files in [[c1.clone(), c2.clone()], [c2, c1]] {
        // Each rank's header names the rank (in its metadata), so the files differ.
        let files: Files = files
            .into_iter()
            .enumerate()
            .map(|(r, mut b)| {
                let at = b.windows(9).position(|w| w == br#""epoch":""#).unwrap() + 9;
                b[at] = b'a' + r as u8;
                (format!("rank{r}.safetensors"), b)
            })
            .collect();
        let tip = sync::remote_branch_tip(&remote, "main").unwrap();
        let (v, transfers) = save(work.path(), &remote, &tip, &files, Layout::Mirror);
        assert_eq!(transfers.iter().map(|t| t.objects_recoded).sum::<u64>(), 0, "{transfers:?}");
        expected.push((v.unwrap(), files));
    }
    assert_clone_reads(work.path(), &url, &expected);
}

#[test]
fn gc_of_the_remote_takes_a_refused_save_but_not_the_blobs_its_recodes_made_needed() {
    // Job B's ranks upload first and, in the mirror layout, recode the previous version's
    // blobs as deltas against B's new blobs; job A's ranks then find those blobs recoded and
    // leave them; A commits and B is refused. B's blobs are in no version, but the previous
    // version's blobs now need them: gc (a day later) must follow the remote's headers.
    let work = tempfile::tempdir().unwrap();
    let url = work.path().join("remote").to_str().unwrap().to_string();
    let remote = DirRemote::create(&url).unwrap();
    let (v1, _) = save(
        work.path(),
        &remote,
        &RemoteTip { version: None, tag: None, read_at: None },
        &rank_files(1),
        Layout::Mirror,
    );
    let v1 = v1.unwrap();
    let tip = sync::remote_branch_tip(&remote, "main").unwrap();
    let mut b_entries = Vec::new();
    let mut recoded = 0;
    for (path, bytes) in &rank_files(3) {
        let (entry, transfer) = save_rank(work.path(), &remote, path, bytes, Some(&v1), Layout::Mirror);
        recoded += transfer.objects_recoded;
        b_entries.push(entry);
    }
    assert!(recoded >= 2, "B's ranks recoded the previous blobs");
    let (won, _) = save(work.path(), &remote, &tip, &rank_files(2), Layout::Mirror);
    let won = won.unwrap();
    let coordinator = tempfile::tempdir_in(work.path()).unwrap();
    let cache = Repo::init(coordinator.path()).unwrap();
    let lost = sync::commit_to_remote(
        &cache,
        &remote,
        sync::RemoteCommit {
            branch: "main",
            tip: &tip,
            files: b_entries,
            stored_bytes: 0,
            message: "B",
            tags: &[],
            options: &CommitOptions::default(),
        },
    );
    assert!(matches!(lost, Err(sync::Error::Rejected { .. })), "{lost:?}");

    let young = sync::gc_remote(&cache, &remote, &sync::RemoteGcOptions::default()).unwrap();
    assert_eq!(young.deleted, 0, "{young:?}");
    // A day and more later.
    let then = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 86400);
    for key in remote.list("objects/").unwrap() {
        let path = Path::new(&url).join(&key);
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_modified(then).unwrap();
    }
    let before = remote.list("objects/").unwrap().len();
    let old = sync::gc_remote(&cache, &remote, &sync::RemoteGcOptions::default()).unwrap();
    assert!(old.deleted > 0 && old.deleted < before, "{old:?}");
    assert_eq!(old.versions, 2, "{old:?}");
    assert_eq!(remote.list("objects/").unwrap().len(), before - old.deleted);
    let mut files = [rank_files(1), rank_files(2)];
    for f in &mut files {
        f.sort();
    }
    let [first, second] = files;
    assert_clone_reads(work.path(), &url, &[(v1, first), (won, second)]);
    // Nothing is left to collect.
    let again = sync::gc_remote(&cache, &remote, &sync::RemoteGcOptions::default()).unwrap();
    assert_eq!(again.deleted, 0, "{again:?}");
}
