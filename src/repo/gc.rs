//! `gc`: deletes every object that no root reaches ([`Repo::roots`]: every ref in any namespace
//! under `refs/`, remote-tracking refs included, a detached `HEAD`, a partial clone's cut
//! versions and the versions pending delta rewrites), keeping every blob a kept delta is coded
//! against (transitively). Marking must read every reachable version and
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
    /// Every root's version ([`Repo::roots`]); the first root that cannot be read is the error.
    pub(super) fn root_versions(&self) -> Result<Vec<VersionId>> {
        self.roots().into_iter().map(|r| r.map(|r| r.id)).collect()
    }

    /// The set of objects reachable from the roots, and the number of versions among them.
    fn mark(&self) -> Result<(HashSet<ObjectId>, usize)> {
        let needed = self.reachable(&self.root_versions()?, &|_| false)?;
        let versions = needed.iter().filter(|n| n.kind == ObjectKind::Version).count();
        Ok((needed.into_iter().map(|n| n.id).collect(), versions))
    }

    /// Deletes unreachable objects and leftover temp files.
    pub fn gc(&self) -> Result<GcReport> {
        let _lock = self.lock()?;
        let (reachable, versions) = self.mark()?;
        let all = self.store.list()?;
        let doomed: Vec<ObjectId> = all.iter().filter(|id| !reachable.contains(id)).copied().collect();
        let mut report = GcReport { versions, kept: all.len() - doomed.len(), ..GcReport::default() };
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
        report.temp_files = self.store.clean_tmp()?;
        self.flush_index();
        Ok(report)
    }
}
