//! Deltas on the wire: which blobs a push sends as XOR deltas against blobs the remote already
//! holds, and how deep the remote's chains may grow (docs/format.md, "Remotes").
//!
//! Locally the newest version is whole and older ones are reverse deltas, so a push after an
//! epoch would otherwise send the new version whole. XOR is symmetric: the new blob can travel
//! as a delta against the same tensor's blob in the parent version, which the remote has,
//! whatever form either side stores it in. The remote then holds forward deltas. Their depth
//! is bounded by the version's `since_base`: a version with `since_base == 0` (which the local
//! store also keeps whole, "pinned") goes up whole, and a blob is coded against a reference
//! only if that reference entered history inside the same base interval, so every chain a push
//! creates is at most `base_every - 1` deltas deep.

use super::commit::ReferenceFiles;
use super::model::{TensorRef, Version};
use super::{Repo, Result, VersionId};
use crate::object_id::ObjectId;
use crate::store::ObjectKind;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

/// How one blob goes up: coded against a blob the remote holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WireDelta {
    /// The blob it is coded against (on the remote already, with everything it needs).
    pub reference: ObjectId,
    /// The depth its chain will have on the remote (written into its header).
    pub depth: u32,
}

impl Repo {
    /// Plans the blobs of the versions in `need` (what a push sends) that go up as deltas: a
    /// blob the remote lacks, stored whole here, whose tensor (same path or reference file,
    /// name, dtype and shape, as commit matches them; bundles by their first tensor) the
    /// version's first parent holds in another blob that the remote has (`on_remote`) and that
    /// entered history after the last pinned version (`since_base == 0`) before it.
    pub(super) fn plan_wire_deltas(
        &self,
        versions: &[VersionId],
        need_blobs: &HashSet<ObjectId>,
        on_remote: &dyn Fn(&ObjectId) -> bool,
    ) -> Result<HashMap<ObjectId, WireDelta>> {
        let mut plan = HashMap::new();
        // Blobs held before each base interval began (by the pinned version's id).
        let mut before_interval: HashMap<VersionId, HashSet<ObjectId>> = HashMap::new();
        for id in versions {
            let v = self.version(id)?;
            let Some(parent_id) = v.parents.first() else { continue };
            if v.since_base == 0 || v.since_base >= self.config.base_every.max(1) || !on_remote(parent_id) {
                continue;
            }
            // The pinned version of this interval: `since_base` must count down to it one per
            // first parent (else this history was not written by ckpt: no deltas).
            let Some((pin_id, pin)) = self.interval_pin(&v) else { continue };
            let older = match before_interval.entry(pin_id) {
                Entry::Occupied(known) => known.into_mut(),
                Entry::Vacant(slot) => {
                    let mut blobs = HashSet::new();
                    if let Some(p) = pin.parents.first() {
                        // Not readable (a partial clone's cut): no deltas in this interval.
                        let Ok(pv) = self.version(p) else { continue };
                        for f in &pv.files {
                            blobs.extend(self.manifest(&f.manifest)?.blobs());
                        }
                    }
                    slot.insert(blobs)
                }
            };
            let parent = self.version(parent_id)?;
            for (new, old) in self.counterparts(&v, &parent)? {
                if new == old
                    || plan.contains_key(&new)
                    || !need_blobs.contains(&new)
                    || !on_remote(&old)
                    || older.contains(&old)
                {
                    continue;
                }
                // Only blobs stored whole here: one sent as it is needs no chain then, if the
                // delta does not pay.
                if self.store.header(&new)?.reference.is_some() || self.store.header(&old)?.kind != ObjectKind::Blob {
                    continue;
                }
                plan.insert(new, WireDelta { reference: old, depth: v.since_base });
            }
        }
        Ok(plan)
    }

    /// The version `since_base` first parents before `v` (with `since_base == 0`), and its id;
    /// `None` if `since_base` does not count down by one per first parent on the way (a history
    /// not written by ckpt) or a version on the way cannot be read.
    fn interval_pin(&self, v: &Version) -> Option<(VersionId, Version)> {
        let mut current = v.clone();
        let mut id = None;
        while current.since_base > 0 {
            let p = *current.parents.first()?;
            let parent = self.version(&p).ok()?;
            if parent.since_base + 1 != current.since_base {
                return None;
            }
            current = parent;
            id = Some(p);
        }
        Some((id?, current))
    }

    /// Pairs (blob in `v`, blob of the same tensor in `parent`) for the files `v` changed, as
    /// the commit and the reverse-delta rewrite match them.
    fn counterparts(&self, v: &Version, parent: &Version) -> Result<Vec<(ObjectId, ObjectId)>> {
        let mut references = ReferenceFiles::new(Some(parent));
        let mut out = Vec::new();
        for f in &v.files {
            if parent.file(&f.path).is_some_and(|p| p.manifest == f.manifest) {
                continue;
            }
            let m = self.manifest(&f.manifest)?;
            let tensors: HashSet<TensorRef> = m.tensors().map(|(t, _)| t.clone()).collect();
            let Some(reference) = references.for_file(self, &f.path, (!tensors.is_empty()).then_some(tensors)) else {
                continue;
            };
            let older_of: HashMap<&TensorRef, ObjectId> =
                reference.tensors().filter_map(|(t, s)| Some((t, s.blob?))).collect();
            let older_bundle: HashMap<&TensorRef, ObjectId> = reference
                .bundle_keys()
                .into_iter()
                .zip(&reference.bundles)
                .filter_map(|(k, b)| Some((k?, b.blob)))
                .collect();
            out.extend(m.tensors().filter_map(|(t, seg)| Some((seg.blob?, *older_of.get(t)?))));
            out.extend(
                m.bundle_keys().into_iter().zip(&m.bundles).filter_map(|(k, b)| Some((b.blob, *older_bundle.get(k?)?))),
            );
        }
        Ok(out)
    }
}
