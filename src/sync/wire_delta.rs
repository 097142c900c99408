//! Deltas on the wire (the deltas layout, [`super::Layout::Deltas`]): which blobs a push sends as XOR deltas
//! against blobs the remote already holds, and how deep the remote's chains may grow
//! (docs/format.md, "Remotes").
//!
//! Locally the newest version is whole and older ones are reverse deltas, so a push after an
//! epoch would otherwise send the new version whole. XOR is symmetric: the new blob can travel
//! as a delta against the same tensor's blob in the parent version, which the remote has,
//! whatever form either side stores it in. The remote then holds forward deltas. Their depth
//! is bounded per interval: the version right after a pinned version (`since_base == 0` with a
//! parent, which the local store keeps whole) goes up whole, and a blob is coded against a
//! reference only if that reference entered history inside the same interval, so every chain a
//! push creates is at most `base_every` deltas deep (`base_every - 1` after the first interval),
//! and each push costs what the local store grew by.

use super::Result;
use crate::object_id::ObjectId;
use crate::repo::{Repo, Version, VersionId};
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

/// Plans the blobs of the versions in `need` (what a push sends) that go up as deltas: a
/// blob the remote lacks, stored whole here, whose tensor (same path or reference file,
/// name, dtype and shape, as commit matches them; bundles by their first tensor) the
/// version's first parent holds in another blob that the remote has (`on_remote`) and that
/// entered history inside the version's interval (`wire_interval`).
pub(super) fn plan_wire_deltas(
    repo: &Repo,
    versions: &[VersionId],
    need_blobs: &HashSet<ObjectId>,
    on_remote: &dyn Fn(&ObjectId) -> bool,
) -> Result<HashMap<ObjectId, WireDelta>> {
    let mut plan = HashMap::new();
    // Blobs held before each interval began (by the id of the version before its start).
    let mut before_interval: HashMap<Option<VersionId>, HashSet<ObjectId>> = HashMap::new();
    for id in versions {
        let v = repo.version(id)?;
        let Some(parent_id) = v.parents.first() else { continue };
        if !on_remote(parent_id) {
            continue;
        }
        // `depth` 0: the version starts an interval and goes up whole.
        let Some((depth, before)) = wire_interval(repo, &v) else { continue };
        if depth == 0 {
            continue;
        }
        let older = match before_interval.entry(before) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(slot) => {
                let mut blobs = HashSet::new();
                if let Some(b) = before {
                    for f in &repo.version(&b)?.files {
                        blobs.extend(repo.manifest(&f.manifest)?.blobs());
                    }
                }
                slot.insert(blobs)
            }
        };
        let parent = repo.version(parent_id)?;
        // The files `v` changed, paired as the commit and the reverse-delta rewrite pair them.
        let mut changed = Vec::new();
        for f in v.files.iter().filter(|f| parent.file(&f.path).is_none_or(|p| p.manifest != f.manifest)) {
            changed.push((f.path.as_str(), repo.manifest(&f.manifest)?));
        }
        for pair in repo.counterparts(changed.iter().map(|(path, m)| (*path, m)), &parent) {
            let (new, old) = (pair.new, pair.old);
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
            if repo.store().header(&new)?.reference.is_some() || repo.store().header(&old)?.kind != ObjectKind::Blob {
                continue;
            }
            plan.insert(new, WireDelta { reference: old, depth });
        }
    }
    Ok(plan)
}

/// Where `v` lies in its interval on the wire: the number of first parents between it
/// and the interval's first version, and that first version's parent (`None`: the
/// interval starts at the root). An interval starts right after a pinned version (one
/// with `since_base == 0` and a parent, which the local store keeps whole), or at the
/// root; so the remote pays a whole version exactly where the local store does (the
/// version after a pin adds a whole copy there, the pin itself only a delta). `None` if
/// no start is found within `base_every` steps (a history not written with this
/// setting) or a version on the way cannot be read (a partial clone's cut): no deltas.
fn wire_interval(repo: &Repo, v: &Version) -> Option<(u32, Option<VersionId>)> {
    let limit = repo.config().base_every.max(1);
    let mut current = v.clone();
    let mut steps = 0;
    loop {
        let Some(p) = current.parents.first().copied() else { return Some((steps, None)) };
        let parent = repo.version(&p).ok()?;
        if parent.is_pinned() {
            return Some((steps, Some(p)));
        }
        steps += 1;
        if steps > limit {
            return None;
        }
        current = parent;
    }
}
