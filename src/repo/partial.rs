//! Partial clones (`ckpt clone --depth N`): a store that holds the newest versions of a branch
//! but not their whole history. `.ckpt/partial` names the remote the history lives on and the
//! versions whose parents are not here ("cut" versions: docs/format.md, "Partial clones").
//! Walks over history (push, gc, verify, log, `~N`) stop at a cut version instead of failing
//! on its missing parent, and `ckpt checkout` of a version outside the depth downloads that
//! version from the remote ([`crate::sync::fetch_revision`]), which becomes one more cut version.
//! The repository core keeps the record; [`crate::sync`] writes it when a fetch cuts history.

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
        let path = self.dir.join(PARTIAL_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| Error::Config { path: path.clone(), reason: format!("partial clone: {e}") }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::Io { action: "reading", path, source }),
        }
    }

    /// The cut versions (empty for a full repository).
    pub(crate) fn cut_versions(&self) -> Result<HashSet<VersionId>> {
        Ok(self.partial_clone()?.map(|p| p.cut.into_iter().collect()).unwrap_or_default())
    }

    /// Whether version `id` is a cut version whose parents are not all here: where history
    /// as this repository holds it ends.
    pub fn history_cut_at(&self, id: &VersionId) -> Result<bool> {
        if !self.cut_versions()?.contains(id) {
            return Ok(false);
        }
        Ok(self.version(id)?.parents.iter().any(|p| !self.store.contains(p)))
    }

    /// The parents of version `id` (with `parents` read from it) that a walk over history
    /// follows: all of them, except a cut version's parents that are not here.
    pub(super) fn parents_here(
        &self,
        cut: &HashSet<VersionId>,
        id: &VersionId,
        parents: &[VersionId],
    ) -> Vec<VersionId> {
        parents.iter().copied().filter(|p| !cut.contains(id) || self.store.contains(p)).collect()
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

    /// Whether `ancestor` is `id` or one of its ancestors (all parents), read locally.
    pub fn is_ancestor(&self, ancestor: &VersionId, id: &VersionId) -> Result<bool> {
        let cut = self.cut_versions()?;
        let mut seen = HashSet::new();
        let mut stack = vec![*id];
        while let Some(v) = stack.pop() {
            if v == *ancestor {
                return Ok(true);
            }
            if seen.insert(v) {
                let parents = self.version(&v)?.parents;
                stack.extend(self.parents_here(&cut, &v, &parents));
            }
        }
        Ok(false)
    }
}
