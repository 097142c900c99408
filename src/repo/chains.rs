//! Delta chains and their full bases: the rules a commit follows to bound how far back a blob's
//! chain of deltas reaches (docs/format.md, "Versions": `since_base`, `base_every`). A new
//! version counts the versions since its last full base; which earlier version its deltas are
//! taken against follows from that count and the delta policy; under `reverse` the last full
//! base keeps its blobs whole ([`Repo::pinned_blobs`]). The commit pipeline and the compaction
//! both read these rules here.

use super::{DeltaPolicy, Repo, Result, Version, VersionId};
use crate::object_id::ObjectId;
use std::collections::HashSet;

/// `since_base` of a new version on top of `parent`: one more than the parent's, or 0 (a new
/// full base) every `base_every` versions and for a root.
pub(crate) fn since_base_after(parent: Option<&Version>, base_every: u32) -> u32 {
    match parent {
        Some(p) if p.since_base + 1 < base_every => p.since_base + 1,
        _ => 0,
    }
}

impl Repo {
    /// The `base_every` a commit uses: `over` if given, else the config's, clamped like the
    /// config (`Config::check`), so no caller can make chains the reader refuses.
    pub(crate) fn base_every(&self, over: Option<u32>) -> u32 {
        over.unwrap_or(self.config.base_every).clamp(1, super::config::MAX_BASE_EVERY)
    }

    /// The version whose tensors a new version's deltas are taken against, for a version
    /// `since_base` versions after its full base on top of `parent`, under `policy`.
    pub(super) fn delta_reference(
        &self,
        parent: Option<&Version>,
        since_base: u32,
        policy: DeltaPolicy,
    ) -> Option<Version> {
        match (since_base, policy, parent) {
            (_, _, None) => None,
            // The parent's tensors are what the new ones' deltas are taken of, also when the
            // new version is a pinned base.
            (_, DeltaPolicy::Reverse, Some(p)) => Some(p.clone()),
            (0, _, _) => None,
            (_, DeltaPolicy::Previous, Some(p)) => Some(p.clone()),
            (_, DeltaPolicy::Base, Some(p)) => self.ancestor_since_base(p, 0),
            (s, DeltaPolicy::Skip, Some(p)) => self.ancestor_since_base(p, s & (s - 1)),
        }
    }

    /// Reverse deltas: the blobs of the last pinned version before `parent` (its full base, the
    /// last version with `since_base == 0`, unless that is the root), which keep their blobs
    /// whole so that chains reach no further back than it. Those blobs can be shared with the
    /// parent (a tensor unchanged since), hence a set of blobs, not a flag on the parent.
    pub(super) fn pinned_blobs(&self, parent: &Version) -> Result<HashSet<ObjectId>> {
        let mut blobs = HashSet::new();
        if let Some(pin) = self.ancestor_since_base(parent, 0).filter(|v| !v.parents.is_empty()) {
            for file in &pin.files {
                blobs.extend(self.manifest(&file.manifest)?.blobs());
            }
        }
        Ok(blobs)
    }

    /// The version at or before `v` along first parents that is `target` versions after its
    /// full base (`since_base == target`; 0: the full base itself). `since_base` drops by exactly
    /// one per first parent in a history ckpt wrote; any other step (a version written by
    /// something else) ends the walk with `None`, which means no delta, after at most
    /// `v.since_base - target` steps.
    fn ancestor_since_base(&self, v: &Version, target: u32) -> Option<Version> {
        if v.since_base <= target {
            return (v.since_base == target).then(|| v.clone());
        }
        let mut since = v.since_base;
        let mut id = *v.parents.first()?;
        loop {
            let (s, parent) = self.since_base_step(&id)?;
            if s + 1 != since {
                return None;
            }
            since = s;
            if since == target {
                return self.version(&id).ok();
            }
            id = parent?;
        }
    }

    /// `since_base` and first parent of version `id` (cached: see `Repo::since_base_walk`).
    fn since_base_step(&self, id: &VersionId) -> Option<(u32, Option<VersionId>)> {
        if let Some(step) = self.since_base_walk.lock().ok().and_then(|c| c.get(id).copied()) {
            return Some(step);
        }
        let v = self.version(id).ok()?;
        let step = (v.since_base, v.parents.first().copied());
        if let Ok(mut cache) = self.since_base_walk.lock() {
            // A bound on memory for a process that lives long (about 100 bytes an entry).
            if cache.len() >= 1 << 16 {
                cache.clear();
            }
            cache.insert(*id, step);
        }
        Some(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Options;
    use crate::repo::MODEL_FORMAT;
    use crate::store::ObjectKind;

    /// Stores a version with no files on top of `parent`; returns it and its id.
    fn store_version(repo: &Repo, parent: Option<VersionId>, since_base: u32) -> (Version, VersionId) {
        let v = Version {
            format: MODEL_FORMAT,
            parents: parent.into_iter().collect(),
            time: 0,
            message: format!("since_base {since_base}"),
            since_base,
            files: Vec::new(),
            raw_bytes: 0,
            stored_bytes: 0,
        };
        let written = repo.store.write_data(ObjectKind::Version, &v.to_bytes(), &Options::default()).unwrap();
        (v, written.id)
    }

    #[test]
    fn ancestors_are_found_by_since_base_and_bad_histories_give_none() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repo::init(dir.path()).unwrap();
        let mut chain = Vec::new();
        let mut parent = None;
        for s in 0..6 {
            let (v, id) = store_version(&repo, parent, s);
            chain.push(v);
            parent = Some(id);
        }
        let tip = chain.last().unwrap();
        for target in 0..=5 {
            assert_eq!(repo.ancestor_since_base(tip, target), Some(chain[target as usize].clone()));
        }
        // A version claiming 9 versions since its base on top of one with 5: the walk stops
        // at the first step that does not drop by one instead of trusting the numbers.
        let (odd, _) = store_version(&repo, parent, 9);
        assert_eq!(repo.ancestor_since_base(&odd, 4), None);
        assert_eq!(repo.ancestor_since_base(&odd, 9), Some(odd.clone()));
        // A missing parent is no ancestor either.
        let (orphan, _) = store_version(&repo, Some(ObjectId::hash(b"not stored")), 3);
        assert_eq!(repo.ancestor_since_base(&orphan, 2), None);
    }
}
