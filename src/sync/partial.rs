//! Partial clones (`ckpt clone --depth N`): a store that holds the newest versions of a branch
//! but not their whole history. `.ckpt/partial` names the remote the history lives on and the
//! versions whose parents are not here ("cut" versions: docs/format.md, "Partial clones").
//! Walks over history (push, gc, verify, log, `~N`) stop at a cut version instead of failing
//! on its missing parent, and `ckpt checkout` of a version outside the depth downloads that
//! version from the remote (`Repo::fetch_revision`), which becomes one more cut version.

use crate::repo::{Error, Repo, Result, VersionId};
use crate::object_id::ObjectId;
use crate::remote::Remote;
use crate::store::ObjectKind;
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
    pub(crate) fn parents_here(
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

    /// Refuses a push that would name, on the remote, a version whose parents neither the
    /// remote (`on_remote`) nor the push hold: a partial clone can push what it builds on top
    /// of its remote's history, not history it never had.
    pub(crate) fn check_pushable(
        &self,
        need: &[crate::repo::Needed],
        on_remote: &dyn Fn(&ObjectId) -> bool,
        url: &str,
    ) -> Result<()> {
        let cut = self.cut_versions()?;
        if cut.is_empty() {
            return Ok(());
        }
        for n in need.iter().filter(|n| n.kind == ObjectKind::Version && cut.contains(&n.id)) {
            let version = self.version(&n.id)?;
            if let Some(p) = version.parents.iter().find(|p| !self.store.contains(p) && !on_remote(p)) {
                return Err(Error::Rejected {
                    remote: url.to_string(),
                    what: format!("version {}", n.id.short(12)),
                    reason: format!(
                        "this partial clone does not hold its parent {} and the remote lacks it",
                        p.short(12)
                    ),
                });
            }
        }
        Ok(())
    }

    /// Resolves `rev` for a checkout; in a partial clone, a version outside the history held
    /// here (a full version id, or `REV~N` reaching past a cut version) is downloaded from the
    /// partial clone's remote first, with everything it needs but not its history. Errors
    /// name the remote when it cannot be reached.
    pub fn fetch_revision(&self, rev: &str, transfers: usize) -> Result<VersionId> {
        let partial = match self.partial_clone()? {
            Some(p) => p,
            None => return self.resolve(rev),
        };
        let resolved = self.resolve(rev);
        if resolved.is_ok() {
            return resolved;
        }
        let Some((base, steps)) = crate::repo::revision::split_ancestry(rev) else { return resolved };
        let start = match self.resolve_base(base) {
            Ok(id) => id,
            Err(_) if base.len() == 64 => match base.parse::<VersionId>() {
                Ok(id) => id,
                Err(_) => return resolved,
            },
            Err(_) => return resolved,
        };
        let remote = self.open_remote(&partial.remote).map_err(|e| Error::PartialCloneRemote {
            remote: partial.remote.clone(),
            rev: rev.to_string(),
            reason: e.to_string(),
        })?;
        let unreachable = |e: Error| Error::PartialCloneRemote {
            remote: format!("{} ({})", partial.remote, remote.url()),
            rev: rev.to_string(),
            reason: e.to_string(),
        };
        let target = self.walk_first_parents(remote.as_ref(), &start, steps, rev).map_err(|e| match e {
            e @ Error::UnknownRevision { .. } => e,
            e => unreachable(e),
        })?;
        if !self.store.contains(&target) {
            // Downloaded without the writer lock, stored under it.
            let mut report = crate::repo::FetchReport::default();
            self.download_then_lock(remote.as_ref(), &[target], transfers, &mut report, Some(1), &partial.remote)
                .map_err(unreachable)?;
        }
        Ok(target)
    }

    /// `steps` first parents back from `start`, reading versions here while they are here and
    /// from `remote` (checked against their ids, not stored) past the cut.
    fn walk_first_parents(&self, remote: &dyn Remote, start: &VersionId, steps: u64, rev: &str) -> Result<VersionId> {
        let mut id = *start;
        // Downloads go to a fetch's own staging directory (no lock is held: gc's clean-up of
        // tmp/ must not delete them under us).
        let mut stage = None;
        for n in 0..steps {
            let version = if self.store.contains(&id) {
                self.version(&id)?
            } else {
                let dir = match &stage {
                    Some(s) => s,
                    None => stage.insert(super::remote::Staging::create(&self.dir)?),
                };
                let tmp = self.receive_staged(remote, &id, dir)?;
                crate::repo::Version::parse(id, &self.store.read_received(&id, ObjectKind::Version, &tmp)?)?
            };
            id = *version.parents.first().ok_or_else(|| Error::UnknownRevision {
                rev: rev.to_string(),
                reason: format!("it has only {n} version{} before it", if n == 1 { "" } else { "s" }),
            })?;
        }
        Ok(id)
    }
}
