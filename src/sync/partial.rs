//! Partial clones from the remote's side: what a partial clone may push, and the download of
//! a version outside the history it holds (`ckpt checkout REV` past the cut). The record of
//! cut versions itself is the repository core's (`crate::repo`, `.ckpt/partial`).

use super::fetch::{download_then_lock, FetchReport};
use super::remote_view::RemoteObjects;
use super::remotes::open_remote;
use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::remote::Remote;
use crate::repo::graph::Objects;
use crate::repo::Error as RepoError;
use crate::repo::{Needed, Repo, VersionId};
use crate::store::ObjectKind;

/// Refuses a push that would name, on the remote, a version whose parents neither the
/// remote (`on_remote`) nor the push hold: a partial clone can push what it builds on top
/// of its remote's history, not history it never had, and a repository whose history
/// `ckpt prune` dropped cannot push it to a remote that lacks it (the push sends no parent of
/// a pruned version, even one still on disk until gc deletes it). Decided before anything goes
/// up, so a refused push leaves nothing on the remote.
pub(super) fn check_pushable(
    repo: &Repo,
    need: &[Needed],
    on_remote: &dyn Fn(&ObjectId) -> bool,
    url: &str,
) -> Result<()> {
    let cut = repo.cut_versions()?;
    if cut.is_empty() {
        return Ok(());
    }
    // Versions this push sends (a parent of a pruned version that another ref keeps goes up
    // with that ref).
    let sent: std::collections::HashSet<ObjectId> =
        need.iter().filter(|n| n.kind == ObjectKind::Version).map(|n| n.id).collect();
    for n in need.iter().filter(|n| n.kind == ObjectKind::Version && cut.contains(&n.id)) {
        let version = repo.version(&n.id)?;
        let pruned = cut.is_pruned(&n.id);
        let lacking = |p: &&VersionId| !on_remote(p) && !sent.contains(*p) && (pruned || !repo.store().contains(p));
        if let Some(p) = version.parents.iter().find(lacking) {
            let reason = if pruned {
                format!(
                    "ckpt prune dropped the history before it here (its parent {}), and the remote lacks that \
                     history: a pruned repository can push only onto a remote that holds the versions it dropped",
                    p.short(12)
                )
            } else {
                format!("this partial clone does not hold its parent {} and the remote lacks it", p.short(12))
            };
            return Err(Error::Rejected {
                remote: url.to_string(),
                what: format!("version {}", n.id.short(12)),
                reason,
            });
        }
    }
    Ok(())
}

/// Resolves `rev` for a checkout; in a partial clone, a version outside the history held
/// here (a full version id, or `REV~N` reaching past a cut version) is downloaded from the
/// partial clone's remote first, with everything it needs but not its history. Errors
/// name the remote when it cannot be reached.
pub fn fetch_revision(repo: &Repo, rev: &str, transfers: usize) -> Result<VersionId> {
    let partial = match repo.partial_clone()? {
        Some(p) => p,
        None => return Ok(repo.resolve(rev)?),
    };
    let resolved = repo.resolve(rev).map_err(Error::from);
    if resolved.is_ok() {
        return resolved;
    }
    let Some((base, steps)) = crate::repo::split_ancestry(rev) else { return resolved };
    let start = match repo.resolve_base(base) {
        Ok(id) => id,
        Err(_) if base.len() == 64 => match base.parse::<VersionId>() {
            Ok(id) => id,
            Err(_) => return resolved,
        },
        Err(_) => return resolved,
    };
    let remote = open_remote(repo, &partial.remote).map_err(|e| Error::PartialCloneRemote {
        remote: partial.remote.clone(),
        rev: rev.to_string(),
        reason: e.to_string(),
    })?;
    let unreachable = |e: Error| Error::PartialCloneRemote {
        remote: format!("{} ({})", partial.remote, remote.url()),
        rev: rev.to_string(),
        reason: e.to_string(),
    };
    let target = walk_first_parents(repo, remote.as_ref(), &start, steps, rev).map_err(|e| match e {
        e @ Error::Repo(RepoError::UnknownRevision { .. }) => e,
        e => unreachable(e),
    })?;
    if !repo.store().contains(&target) {
        // Downloaded without the writer lock, stored under it.
        let mut report = FetchReport::default();
        download_then_lock(repo, remote.as_ref(), &[target], transfers, &mut report, Some(1), &partial.remote)
            .map_err(unreachable)?;
    }
    Ok(target)
}

/// `steps` first parents back from `start`, reading versions here while they are here and
/// from `remote` (checked against their ids, not stored) past the cut.
fn walk_first_parents(repo: &Repo, remote: &dyn Remote, start: &VersionId, steps: u64, rev: &str) -> Result<VersionId> {
    let objects = RemoteObjects::new(repo, remote);
    let mut id = *start;
    for n in 0..steps {
        id = *objects.version(&id)?.parents.first().ok_or_else(|| {
            Error::from(RepoError::UnknownRevision {
                rev: rev.to_string(),
                reason: format!("it has only {n} version{} before it", if n == 1 { "" } else { "s" }),
            })
        })?;
    }
    Ok(id)
}
