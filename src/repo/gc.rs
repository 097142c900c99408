//! `gc`: deletes every object that no branch, tag or `HEAD` reaches, keeping every blob a kept
//! delta is coded against (transitively). Marking must read every reachable version and
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
    /// Every ref target: branches, tags and a detached `HEAD`.
    pub(super) fn ref_roots(&self) -> Result<Vec<VersionId>> {
        let mut roots: Vec<VersionId> = self.refs.list(super::RefKind::Branch)?.into_iter().map(|(_, id)| id).collect();
        roots.extend(self.refs.list(super::RefKind::Tag)?.into_iter().map(|(_, id)| id));
        roots.extend(self.refs.head_version()?);
        Ok(roots)
    }

    /// The set of objects reachable from the refs, and the number of versions among them.
    fn mark(&self) -> Result<(HashSet<ObjectId>, usize)> {
        let needed = self.reachable(&self.ref_roots()?, &|_| false)?;
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
