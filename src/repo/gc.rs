//! `gc`: deletes every object that no root reaches ([`Repo::roots`]: every ref in any namespace
//! under `refs/`, remote-tracking refs included, a detached `HEAD`, a partial clone's cut
//! versions and the versions pending delta rewrites), keeping every blob a kept delta is coded
//! against (transitively). The working tree's stat records whose content it deletes are
//! forgotten first (docs/format.md, "What gc keeps"). Marking must read every reachable version and
//! manifest and every reachable blob's header; if any of them cannot be read, gc stops before
//! deleting anything, since it cannot know what the unreadable object needs.

use super::{Repo, Result, VersionId};
use crate::object_id::ObjectId;
use crate::store::ObjectKind;
use std::collections::HashSet;

/// What `gc` did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcReport {
    /// Versions reachable from refs.
    pub versions: usize,
    /// Objects kept.
    pub kept: usize,
    /// Objects deleted.
    pub deleted: usize,
    /// Bytes of the deleted object files.
    pub bytes_freed: u64,
    /// Leftover temp files of interrupted writes deleted.
    pub temp_files: usize,
}

impl Repo {
    /// Every root's version ([`Repo::roots`]: refs of every namespace, a detached `HEAD`, the
    /// records that name versions); the first root that cannot be read is the error.
    pub(super) fn ref_roots(&self) -> Result<Vec<VersionId>> {
        self.roots().into_iter().map(|r| r.map(|r| r.id)).collect()
    }

    /// The set of objects reachable from the roots, the number of versions among them, and the
    /// file hashes those versions hold.
    fn mark(&self) -> Result<(HashSet<ObjectId>, usize, HashSet<ObjectId>)> {
        let needed = self.reachable(&self.ref_roots()?, &|_| false)?;
        let mut versions = 0;
        let mut held = HashSet::new();
        for n in needed.iter().filter(|n| n.kind == ObjectKind::Version) {
            versions += 1;
            held.extend(self.version(&n.id)?.files.into_iter().map(|f| f.hash));
        }
        Ok((needed.into_iter().map(|n| n.id).collect(), versions, held))
    }

    /// Forgets the working-file identities (index `stat` records) whose content no kept version
    /// holds. A record lets `checkout` and `switch` overwrite a file without reading it because
    /// its content is in the store; once gc deletes that content, the file may be its only copy,
    /// so it must count as modified again (and be hashed) instead. Runs before anything is
    /// deleted: a record that cannot be forgotten stops gc.
    fn forget_stats_of_deleted_content(&self, held: &HashSet<ObjectId>) -> Result<()> {
        let Some(ix) = self.index() else { return Ok(()) };
        for (path, record) in ix.stats()? {
            if !held.contains(&record.hash) {
                ix.remove_stat(&path)?;
            }
        }
        Ok(ix.flush()?)
    }

    /// Deletes unreachable objects and leftover temp files.
    pub fn gc(&self) -> Result<GcReport> {
        let _lock = self.lock()?;
        let (reachable, versions, held) = self.mark()?;
        let all = self.store.list()?;
        let doomed: Vec<ObjectId> = all.iter().filter(|id| !reachable.contains(id)).copied().collect();
        let mut report = GcReport { versions, kept: all.len() - doomed.len(), ..GcReport::default() };
        self.forget_stats_of_deleted_content(&held)?;
        self.progress.start("gc", doomed.len() as u64);
        for (n, id) in doomed.iter().enumerate() {
            let len = self.store.stored_len(id).unwrap_or(0);
            if let Some(ix) = self.index() {
                let _ = ix.remove_object(id);
                let _ = ix.remove_version(id);
            }
            self.store.remove(id)?;
            report.deleted += 1;
            report.bytes_freed += len;
            self.progress.set(n as u64 + 1);
        }
        self.progress.finish();
        report.temp_files = self.store.clean_tmp()? + self.clean_stale_checkout_staging();
        self.flush_index();
        Ok(report)
    }

    /// Deletes the staging directories (`.ckpt/tmp/.ckpt-checkout-*`) that a checkout killed
    /// mid-way left behind, once untouched for [`STALE_STAGING`]: checkouts take no lock (they
    /// only read the store), so a younger one may belong to a checkout still writing, whose
    /// every staged file renews the directory's mtime. Best effort: returns how many went.
    fn clean_stale_checkout_staging(&self) -> usize {
        let tmp = self.dir.join("tmp");
        let Ok(entries) = std::fs::read_dir(&tmp) else { return 0 };
        let mut n = 0;
        for entry in entries.flatten() {
            let is_staging = entry.file_name().to_string_lossy().starts_with(".ckpt-checkout-");
            let stale = entry
                .metadata()
                .ok()
                .filter(|m| m.is_dir())
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= STALE_STAGING);
            if is_staging && stale && std::fs::remove_dir_all(entry.path()).is_ok() {
                n += 1;
            }
        }
        n
    }
}

/// How long a checkout's staging directory must be untouched before gc takes it for a
/// leftover: far longer than staging one file of any checkpoint takes.
const STALE_STAGING: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
