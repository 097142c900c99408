//! What a write to a remote checks so that it never spreads damage there (docs/format.md,
//! "Bit rot and repairs"):
//!
//! - every object it uploads, or codes a delta against, is verified in the local store first
//!   (decoded and hashed, as `ckpt verify` re-hashes objects: blobs a delta chain at a time),
//!   and a damaged one stops the write before anything that needs it goes up. The cost is one
//!   read of what goes up;
//! - a mirror recode replaces a remote blob by a delta only against a newer blob whose remote
//!   copy is known good: uploaded by this process after it verified it, or downloaded and
//!   checked against its id. A damaged one is replaced by an intact copy from here first;
//! - `ckpt push --repair` downloads and checks the remote's copy of everything the pushed refs
//!   need and replaces each damaged one by an intact copy from here.
//!
//! A replacement is the object's standalone form (as [`super::freshness::keep_found`] writes one): it
//! references nothing, so writing it over any form closes no reference cycle, and a remote
//! delta on it decodes as before (same content).

use super::freshness::standalone_form;
use super::transfer::{parallel, receive_into, reopen, with_retries, Staging};
use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::remote::{self, Remote};
use crate::repo::Repo;
use crate::store::ObjectKind;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// What one write to a remote has checked so far.
#[derive(Debug, Default)]
pub(super) struct Checked {
    /// Objects of the local store verified (decoded and hashed).
    here: Mutex<HashSet<ObjectId>>,
    /// Objects whose remote copy is known good: this process wrote it there from verified
    /// bytes, or downloaded it and checked it against its id.
    there: Mutex<HashSet<ObjectId>>,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Checked {
    /// Verifies the objects of `ids` not verified yet, all at once (each object decoded about
    /// once: [`Repo::damaged`]); any damaged or missing one refuses the write
    /// ([`Error::DamagedHere`], naming them all).
    pub(super) fn verify_here(
        &self,
        repo: &Repo,
        remote: &dyn Remote,
        ids: impl IntoIterator<Item = ObjectId>,
    ) -> Result<()> {
        let todo: Vec<ObjectId> = {
            let here = locked(&self.here);
            let mut seen = HashSet::new();
            ids.into_iter().filter(|id| !here.contains(id) && seen.insert(*id)).collect()
        };
        if todo.is_empty() {
            return Ok(());
        }
        let bad = repo.damaged(&todo)?;
        if !bad.is_empty() {
            return Err(Error::DamagedHere { remote: remote.url().to_string(), objects: bad });
        }
        locked(&self.here).extend(todo);
        Ok(())
    }

    /// Notes that the remote's copy of `id` is known good.
    pub(super) fn good_there(&self, id: ObjectId) {
        locked(&self.there).insert(id);
    }

    /// Whether the remote's copy of `id` is known good.
    pub(super) fn is_good_there(&self, id: &ObjectId) -> bool {
        locked(&self.there).contains(id)
    }

    /// Makes sure the remote's copy of blob `id` is intact before a recode codes a delta
    /// against it: known good already, or downloaded and checked now, and if damaged, replaced
    /// by an intact copy from here. False if it is neither (absent, or a delta against a blob
    /// this store lacks): nothing is to be coded against it.
    pub(super) fn reference_there(&self, repo: &Repo, remote: &dyn Remote, id: &ObjectId) -> Result<bool> {
        if self.is_good_there(id) {
            return Ok(true);
        }
        let stage = Staging::create(repo.ckpt_dir())?;
        match check_there(repo, remote, id, Some(ObjectKind::Blob), &stage)? {
            There::Intact => {}
            There::Damaged => {
                replace_there(repo, remote, id, self)?;
            }
            There::Missing | There::Unchecked => return Ok(false),
        }
        self.good_there(*id);
        Ok(true)
    }
}

/// What a remote holds of an object ([`check_there`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum There {
    /// It decodes to its id.
    Intact,
    /// Not there.
    Missing,
    /// It does not decode to its id.
    Damaged,
    /// A delta against an object this store lacks, so it cannot be checked here.
    Unchecked,
}

/// Downloads object `id` (of `kind`, if given) from `remote` into `stage` and checks it against
/// its id as a fetch checks what it receives ([`crate::store::Store::check_received`]: decoded,
/// a delta through the content of its references here, and hashed). Errors are for failures to
/// check at all (the network, the local disk).
pub(super) fn check_there(
    repo: &Repo,
    remote: &dyn Remote,
    id: &ObjectId,
    kind: Option<ObjectKind>,
    stage: &Staging,
) -> Result<There> {
    let received = AtomicU64::new(0);
    let tmp = match receive_into(repo, remote, id, &received, stage.dir()) {
        Ok(path) => reopen(path)?,
        Err(Error::Remote(remote::Error::NotFound { .. })) => return Ok(There::Missing),
        Err(Error::Remote(remote::Error::TooLarge { .. })) => return Ok(There::Damaged),
        Err(e) => return Err(e),
    };
    Ok(match repo.store().check_received(id, kind, &tmp) {
        Ok(_) => There::Intact,
        Err(crate::store::Error::Missing { id: lacking }) if lacking != *id => There::Unchecked,
        Err(e @ crate::store::Error::Io { .. }) => return Err(e.into()),
        Err(_) => There::Damaged,
    })
}

/// Replaces the remote's copy of `id`, found damaged, by the object's standalone form from
/// here, verified first ([`standalone_form`]). Returns the bytes sent.
pub(super) fn replace_there(repo: &Repo, remote: &dyn Remote, id: &ObjectId, checked: &Checked) -> Result<u64> {
    let (tmp, len) = standalone_form(repo, remote, id)?;
    let key = remote::object_key(id);
    with_retries(|| Ok(remote.replace(&key, tmp.as_file(), tmp.path(), len)?))?;
    checked.good_there(*id);
    Ok(len)
}

/// What [`find_damaged_there`] found.
#[derive(Debug, Default)]
pub(super) struct Survey {
    /// Objects downloaded and checked.
    pub checked: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Those that do not decode to their id.
    pub damaged: Vec<ObjectId>,
    /// Those that could not be checked here (deltas against objects this store lacks).
    pub unchecked: Vec<ObjectId>,
}

/// `ckpt push --repair`'s look at the remote: downloads each of `ids` (objects this store
/// holds, listed on the remote; each with its kind) and checks it against its id, `transfers`
/// at a time; the intact ones are noted as good there.
pub(super) fn find_damaged_there(
    repo: &Repo,
    remote: &dyn Remote,
    ids: &[(ObjectId, ObjectKind, u64)],
    checked: &Checked,
    transfers: usize,
) -> Result<Survey> {
    let stage = Staging::create(repo.ckpt_dir())?;
    let total: u64 = ids.iter().map(|(_, _, size)| size).sum();
    repo.progress().start("check remote", total);
    let done = AtomicU64::new(0);
    let survey = Mutex::new(Survey::default());
    parallel(ids, transfers, |(id, kind, size)| {
        let found = check_there(repo, remote, id, Some(*kind), &stage)?;
        let mut survey = locked(&survey);
        survey.checked += 1;
        survey.bytes += size;
        match found {
            There::Intact => checked.good_there(*id),
            // Gone since the listing (a gc): the push uploads what the remote lacks.
            There::Missing => {}
            There::Damaged => survey.damaged.push(*id),
            There::Unchecked => survey.unchecked.push(*id),
        }
        repo.progress().set(done.fetch_add(*size, Ordering::Relaxed) + size);
        Ok(())
    })?;
    repo.progress().finish();
    let mut survey = survey.into_inner().unwrap_or_else(|e| e.into_inner());
    survey.damaged.sort();
    survey.unchecked.sort();
    Ok(survey)
}
