//! Partial clones (`ckpt clone --depth N`): a store that holds the newest versions of a branch
//! but not their whole history. `.ckpt/partial` names the remote the history lives on and the
//! versions whose parents are not here ("cut" versions: docs/format.md, "Partial clones").
//! Walks over history (push, gc, verify, log, `~N`) stop at a cut version instead of failing
//! on its missing parent, and `ckpt checkout` of a version outside the depth downloads that
//! version from the remote ([`crate::sync::fetch_revision`]), which becomes one more cut version.
//! The repository core keeps the record; [`crate::sync`] writes it when a fetch cuts history.
//! `ckpt prune` cuts history too, for good ([`super::prune`], `.ckpt/pruned`): [`HistoryCuts`]
//! holds both kinds, so that every walk stops at either.

use super::graph::{self, Node};
use super::{Error, Repo, Result, VersionId};
use std::collections::HashSet;

/// `.ckpt/partial`: JSON `{"remote": NAME, "cut": [VERSION ID, ...]}`.
const PARTIAL_FILE: &str = "partial";

/// What makes a clone partial.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialClone {
    /// The remote (by name) that holds the rest of the history.
    pub remote: String,
    /// Versions held here whose parents may not be.
    pub cut: Vec<VersionId>,
}

impl Repo {
    /// The partial-clone record, `None` for a repository that holds its whole history.
    pub fn partial_clone(&self) -> Result<Option<PartialClone>> {
        self.read_record(PARTIAL_FILE, "partial clone")
    }

    /// Where history ends in this repository: a partial clone's cut versions and the versions
    /// `ckpt prune` dropped the history of (both empty for a repository holding its whole
    /// history).
    pub(crate) fn cut_versions(&self) -> Result<HistoryCuts> {
        let partial = self.partial_clone()?.map(|p| p.cut.into_iter().collect()).unwrap_or_default();
        let pruned = self.pruned_history()?.cut.into_iter().collect();
        Ok(HistoryCuts { partial, pruned })
    }

    /// Whether version `id` is a cut version whose parents are not all here: where history
    /// as this partial clone holds it ends.
    pub fn history_cut_at(&self, id: &VersionId) -> Result<bool> {
        if !self.cut_versions()?.partial.contains(id) {
            return Ok(false);
        }
        Ok(self.version(id)?.parents.iter().any(|p| !self.store.contains(p)))
    }

    /// The parents of version `id` (with `parents` read from it) that a walk over history
    /// follows: all of them, except a partial clone's cut version's parents that are not here
    /// and every parent of a version whose history was pruned (even while some are still on
    /// disk: they are garbage, or kept by a root of their own).
    pub(super) fn parents_here(&self, cut: &HistoryCuts, id: &VersionId, parents: &[VersionId]) -> Vec<VersionId> {
        if cut.pruned.contains(id) {
            return Vec::new();
        }
        parents.iter().copied().filter(|p| !cut.partial.contains(id) || self.store.contains(p)).collect()
    }

    /// [`Self::parents_here`] of version `id`, its parents read through the object graph.
    pub(super) fn parents_followed(&self, cut: &HistoryCuts, id: &VersionId) -> Result<Vec<VersionId>> {
        Ok(self.parents_here(cut, id, &graph::versions(&graph::edges(self, Node::Version(*id))?)))
    }

    /// History from `tip` back along first parents, newest first, each version with its
    /// `log` metadata (from the index when cached), ending at a cut version whose first parent
    /// is not followed ([`Self::parents_here`]). An unreadable version is an error; so is a
    /// history that does not end (a cycle, only in a damaged store).
    pub(super) fn first_parents<'a>(
        &'a self,
        tip: VersionId,
        cut: &'a HistoryCuts,
    ) -> impl Iterator<Item = Result<super::VersionInfo>> + 'a {
        let mut next = Some(tip);
        let mut steps = 0usize;
        std::iter::from_fn(move || {
            let id = next.take()?;
            steps += 1;
            if steps > 10_000_000 {
                return Some(Err(Error::CorruptMetadata { id, reason: "history does not end".into() }));
            }
            let info = self.version_info(&id);
            if let Ok(info) = &info {
                let first = info.parents.first();
                let followed = !cut.pruned.contains(&id)
                    && (!cut.partial.contains(&id) || first.is_some_and(|p| self.store.contains(p)));
                next = first.copied().filter(|_| followed);
            }
            Some(info)
        })
    }

    /// Records `ids` as cut versions of a partial clone of remote `remote`. Written before the
    /// versions are stored, so that no version lacking its parents is ever unaccounted for.
    pub(crate) fn add_cut(&self, remote: &str, ids: &[VersionId]) -> Result<()> {
        let mut partial = self.partial_clone()?.unwrap_or_else(|| PartialClone { remote: remote.into(), cut: vec![] });
        for id in ids {
            if !partial.cut.contains(id) {
                partial.cut.push(*id);
            }
        }
        let mut text = serde_json::to_string_pretty(&partial).expect("plain data serializes");
        text.push('\n');
        self.refs.write(&self.dir.join(PARTIAL_FILE), &text)
    }

    /// Whether `ancestor` is `id` or one of its ancestors (all parents), read locally. Where
    /// history is cut (partial clone or prune), the parents still here are followed: ancestry
    /// is a fact the versions record (a push asks it of a remote's tip that this store holds
    /// again), not what keeps them.
    pub(crate) fn is_ancestor(&self, ancestor: &VersionId, id: &VersionId) -> Result<bool> {
        let cut = self.cut_versions()?;
        let mut found = false;
        let enter = |n: &Node| {
            found |= n.id() == *ancestor;
            !found
        };
        graph::walk(self, [Node::Version(*id)], enter, |node, edges| {
            let here = |p: &VersionId| !cut.contains(&node.id()) || self.store.contains(p);
            Ok(graph::versions(&edges).into_iter().filter(here).map(Node::Version).collect())
        })?;
        Ok(found)
    }
}

/// Where walks over history end ([`Repo::cut_versions`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistoryCuts {
    /// A partial clone's cut versions (`.ckpt/partial`): their parents are followed when here.
    pub(super) partial: HashSet<VersionId>,
    /// Versions whose history `ckpt prune` dropped (`.ckpt/pruned`): their parents are never
    /// followed.
    pub(super) pruned: HashSet<VersionId>,
}

impl HistoryCuts {
    /// Whether history may end at `id`.
    pub(crate) fn contains(&self, id: &VersionId) -> bool {
        self.partial.contains(id) || self.pruned.contains(id)
    }

    /// Whether history ends nowhere (a repository holding all of it).
    pub(crate) fn is_empty(&self) -> bool {
        self.partial.is_empty() && self.pruned.is_empty()
    }

    /// Whether `ckpt prune` dropped the history of `id`.
    pub(crate) fn is_pruned(&self, id: &VersionId) -> bool {
        self.pruned.contains(id)
    }
}
