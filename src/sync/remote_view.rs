//! One view of a remote, the one place that reads what a remote holds: its refs (listed and
//! parsed, a branch's tip, a revision resolved; moved by compare-and-swap), the header of an
//! object there, and its versions and manifests as a walk of the object graph reads them
//! ([`RemoteObjects`], the remote's [`graph::Objects`] source), down to the blobs of its
//! branch tips.
//!
//! A ref that cannot be read, is a directory of keys, or does not hold a version id is an
//! error naming it wherever it is read, never a ref that is not there: a clone would be empty,
//! a fetch would keep a stale remote-tracking ref, a gc would delete what only it reaches.

use super::freshness::Moment;
use super::transfer::{receive, reopen, OBJECT_ATTEMPTS};
use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::remote::{self, Expect, Remote};
use crate::repo::graph::{self, Node, Objects};
use crate::repo::Error as RepoError;
use crate::repo::{check_name, Manifest, RefKind, Repo, Version, VersionId};
use crate::store::{ObjectHeader, ObjectKind, HEADER_LEN};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

/// The key of a branch or tag on a remote: `refs/heads/NAME`, `refs/tags/NAME`.
pub(super) fn ref_key(kind: RefKind, name: &str) -> String {
    match kind {
        RefKind::Branch => format!("refs/heads/{name}"),
        RefKind::Tag => format!("refs/tags/{name}"),
    }
}

fn parse_ref(remote: &dyn Remote, key: &str, bytes: &[u8]) -> Result<VersionId> {
    let bad = || Error::BadRemoteRef {
        remote: remote.url().to_string(),
        key: key.to_string(),
        reason: "not a ref (expected 64 hex digits and a newline)".into(),
    };
    let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
    let hex = text.strip_suffix('\n').ok_or_else(bad)?;
    hex.parse::<ObjectId>().ok().filter(|id| id.to_hex() == hex).ok_or_else(bad)
}

/// The version the ref `key` of `remote` names, with the tag a compare-and-swap against it
/// expects ([`remote::Small::tag`]); `None` if there is no such key (deleted since it was
/// listed). A ref that cannot be read (on a directory remote: a directory, a link, a pipe) or
/// does not hold a version id is an error naming it.
pub(super) fn read_ref(remote: &dyn Remote, key: &str) -> Result<Option<(VersionId, String)>> {
    match remote.get_small(key)? {
        Some(small) => Ok(Some((parse_ref(remote, key, &small.bytes)?, small.tag))),
        None => Ok(None),
    }
}

/// A branch or tag of a remote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct RemoteRef {
    /// Branch or tag.
    pub(super) kind: RefKind,
    /// Its name.
    pub(super) name: String,
    /// The version it names.
    pub(super) id: VersionId,
}

/// What a key under `refs/` names: `refs/heads/NAME` or `refs/tags/NAME` with NAME a ref
/// name ([`check_name`]), and whether the key goes on inside it (`refs/heads/NAME/x`). `None`:
/// not ckpt's.
fn ref_of_key(key: &str) -> Option<(RefKind, &str, bool)> {
    let (kind, rest) = if let Some(n) = key.strip_prefix("refs/heads/") {
        (RefKind::Branch, n)
    } else {
        (RefKind::Tag, key.strip_prefix("refs/tags/")?)
    };
    let (name, deeper) = match rest.split_once('/') {
        Some((name, _)) => (name, true),
        None => (rest, false),
    };
    check_name(name).ok().map(|()| (kind, name, deeper))
}

/// Whether the branch or tag `kind name` is among those asked for: with `only_branch`, that
/// branch alone.
fn asked(kind: RefKind, name: &str, only_branch: Option<&str>) -> bool {
    only_branch.is_none_or(|b| kind == RefKind::Branch && b == name)
}

/// The keys under `refs/` of `remote`, sorted; a ref that is a directory is refused: keys
/// inside a ref's name (`refs/heads/main/x`) and no key of that name (a directory remote lists
/// an empty directory as a key, which its read then refuses). With `only_branch`, that branch
/// alone is looked at for directories.
fn ref_keys(remote: &dyn Remote, only_branch: Option<&str>) -> Result<Vec<String>> {
    let mut keys = remote.list("refs/")?;
    keys.sort();
    for key in &keys {
        let Some((kind, name, true)) = ref_of_key(key) else { continue };
        let ref_key = ref_key(kind, name);
        if asked(kind, name, only_branch) && keys.binary_search(&ref_key).is_err() {
            return Err(Error::BadRemoteRef {
                remote: remote.url().to_string(),
                key: ref_key,
                reason: format!("not a ref: a directory (of {key})"),
            });
        }
    }
    Ok(keys)
}

/// The branches and tags of `remote` (with `only_branch`, that branch alone), sorted by key,
/// each read with [`read_ref`]: what a fetch or a clone takes. A key under `refs/` that is not
/// a branch or tag ([`ref_of_key`]) is not ckpt's and is left out; a ref that is a directory
/// or cannot be read is an error naming it.
pub(super) fn remote_refs(remote: &dyn Remote, only_branch: Option<&str>) -> Result<Vec<RemoteRef>> {
    let mut refs = Vec::new();
    for key in &ref_keys(remote, only_branch)? {
        let Some((kind, name, false)) = ref_of_key(key) else { continue };
        if !asked(kind, name, only_branch) {
            continue;
        }
        if let Some((id, _)) = read_ref(remote, key)? {
            refs.push(RemoteRef { kind, name: name.to_string(), id });
        }
    }
    Ok(refs)
}

/// The versions every key under `refs/` names, whatever its name (a ref of a newer ckpt keeps
/// what it reaches): the roots of `ckpt gc --remote`. A key that is a directory, cannot be
/// read or does not hold a version id is an error naming it.
pub(super) fn every_ref(remote: &dyn Remote) -> Result<Vec<VersionId>> {
    let mut versions = Vec::new();
    for key in &ref_keys(remote, None)? {
        versions.extend(read_ref(remote, key)?.map(|(id, _)| id));
    }
    Ok(versions)
}

/// Of branch names, the one a clone checks out: `main`, else the first by name.
pub(super) fn default_branch(names: impl IntoIterator<Item = String>) -> Option<String> {
    let mut names: Vec<String> = names.into_iter().collect();
    names.sort();
    match names.iter().position(|b| b == crate::repo::DEFAULT_BRANCH) {
        Some(i) => Some(names.swap_remove(i)),
        None => names.into_iter().next(),
    }
}

/// Moves the remote ref `key` to `id` by compare-and-swap against `expect`. A failed put is
/// ambiguous (a dropped connection or a timeout may come after the server moved the ref), so
/// the ref is read back: if it holds `id`, the put took effect; if it is still as `expect`
/// says, the put is tried again (up to [`OBJECT_ATTEMPTS`] times; the compare-and-swap keeps
/// that safe); if it changed, that is [`remote::Error::Conflict`].
pub(super) fn put_ref(remote: &dyn Remote, key: &str, id: &VersionId, expect: &Expect) -> remote::Result<()> {
    let text = format!("{id}\n");
    let mut attempt = 1;
    loop {
        let error = match remote.put_small(key, text.as_bytes(), expect) {
            Ok(()) => return Ok(()),
            Err(e @ (remote::Error::Backend { .. } | remote::Error::Conflict { .. })) => e,
            Err(e) => return Err(e),
        };
        let Ok(current) = remote.get_small(key) else { return Err(error) };
        let unchanged = match (expect, &current) {
            (_, Some(small)) if small.bytes == text.as_bytes() => return Ok(()),
            (Expect::Absent, None) => true,
            (Expect::Tag(tag), Some(small)) => small.tag == *tag,
            _ => false,
        };
        if !unchanged || !matches!(error, remote::Error::Backend { .. }) || attempt >= OBJECT_ATTEMPTS {
            return Err(error);
        }
        std::thread::sleep(std::time::Duration::from_millis(100 << attempt));
        attempt += 1;
    }
}

/// Where a branch of a remote was when a save began: its version and the tag the save's
/// compare-and-swap expects ([`remote::Small::tag`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteTip {
    /// The version the branch names (`None`: no such branch yet).
    pub version: Option<VersionId>,
    /// The ref's tag as read (`None`: the ref did not exist).
    pub tag: Option<String>,
    /// When it was read (`None`: not known, no deadline). [`super::commit_to_remote`] moves
    /// the branch only within [`super::WRITE_DEADLINE`] of it (docs/format.md, "Garbage on a
    /// remote").
    pub read_at: Option<Moment>,
}

impl RemoteTip {
    /// What a compare-and-swap against this tip expects.
    pub(super) fn expect(&self) -> Expect {
        match &self.tag {
            Some(tag) => Expect::Tag(tag.clone()),
            None => Expect::Absent,
        }
    }
}

/// Reads where `branch` is on `remote` (one request).
pub fn remote_branch_tip(remote: &dyn Remote, branch: &str) -> Result<RemoteTip> {
    check_name(branch)?;
    let read_at = Some(Moment::now());
    let (version, tag) = read_ref(remote, &ref_key(RefKind::Branch, branch))?.unzip();
    Ok(RemoteTip { version, tag, read_at })
}

/// The version `rev` names on `remote`: `HEAD` (the branch `clone` checks out: `main`, else
/// the first branch by name), a branch, a tag, a full version id the remote holds, or a unique
/// prefix of one (at least 4 hex digits, looked up after branches and tags, as a repository
/// resolves one).
pub fn resolve_remote(remote: &dyn Remote, rev: &str) -> Result<VersionId> {
    let unknown = |reason: String| Error::from(RepoError::UnknownRevision { rev: rev.to_string(), reason });
    if rev == "HEAD" {
        let keys = remote.list("refs/heads/")?;
        let names = keys.iter().filter_map(|k| k.strip_prefix("refs/heads/")).filter(|b| check_name(b).is_ok());
        let branch = default_branch(names.map(str::to_string))
            .ok_or_else(|| unknown(format!("{} has no branch", remote.url())))?;
        return resolve_remote(remote, &branch);
    }
    if rev.len() == 64 {
        if let Ok(id) = rev.parse::<VersionId>() {
            if remote.exists(&remote::object_key(&id))? {
                return Ok(id);
            }
            return Err(unknown(format!("{} has no such version", remote.url())));
        }
    }
    let is_prefix = (4..64).contains(&rev.len()) && rev.bytes().all(|b| b.is_ascii_hexdigit());
    if !is_prefix {
        check_name(rev)?;
    }
    if check_name(rev).is_ok() {
        for kind in [RefKind::Branch, RefKind::Tag] {
            if let Some((id, _)) = read_ref(remote, &ref_key(kind, rev))? {
                return Ok(id);
            }
        }
    }
    if is_prefix {
        return match versions_with_prefix(remote, &rev.to_ascii_lowercase())?.as_slice() {
            [id] => Ok(*id),
            [] => Err(unknown(format!("not a branch, tag or version of {}", remote.url()))),
            many => Err(unknown(format!(
                "ambiguous: {} versions of {} start with it ({})",
                many.len(),
                remote.url(),
                many.iter().take(4).map(|i| i.short(12)).collect::<Vec<_>>().join(", ")
            ))),
        };
    }
    Err(unknown(format!("not a branch, tag or version of {}", remote.url())))
}

/// The versions of `remote` whose id starts with `prefix` (lowercase hex, at least 4 digits),
/// as a repository resolves a short id: the objects listed under its fan-out directory, each
/// a version by its header.
fn versions_with_prefix(remote: &dyn Remote, prefix: &str) -> Result<Vec<VersionId>> {
    let mut found = Vec::new();
    for key in remote.list(&format!("objects/{}/", &prefix[..2]))? {
        let Some(id) = remote::object_of_key(&key).filter(|id| id.to_hex().starts_with(prefix)) else { continue };
        if remote_header(remote, &id)?.is_some_and(|(h, _)| h.kind == ObjectKind::Version) {
            found.push(id);
        }
    }
    found.sort();
    Ok(found)
}

/// The header of object `id` on `remote` and the object's size there (one ranged read: its
/// form there may differ from this store's); `None` if it is absent. A header that does not
/// decode is an error.
pub(super) fn remote_header(remote: &dyn Remote, id: &ObjectId) -> Result<Option<(ObjectHeader, u64)>> {
    match remote.read_head(&remote::object_key(id), HEADER_LEN as u64) {
        Ok((head, size)) => Ok(Some((ObjectHeader::decode(*id, &head)?, size))),
        Err(remote::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Version or manifest `id` (of `kind`) downloaded from `remote` into a temp file of `repo`'s
/// store (at most what its header states: [`super::transfer::download_object`]) and its
/// content, verified against its id; not stored.
pub(super) fn download_data(
    repo: &Repo,
    remote: &dyn Remote,
    id: &ObjectId,
    kind: ObjectKind,
) -> Result<(tempfile::NamedTempFile, Vec<u8>)> {
    let tmp = reopen(receive(repo, remote, id, &AtomicU64::new(0))?)?;
    let data = repo.store().read_received(id, kind, &tmp)?;
    Ok((tmp, data))
}

/// The objects of a remote as a walk of the object graph reads them: a version or manifest
/// `repo`'s store holds is read there (same id, same content), any other downloaded and
/// verified against its id, not stored; a blob's header is read on the remote, whose form of
/// it may differ from this store's.
pub(super) struct RemoteObjects<'a> {
    pub(super) repo: &'a Repo,
    pub(super) remote: &'a dyn Remote,
    /// Headers [`RemoteObjects::node_of`] read, kept for the walk's next read of them.
    headers: Mutex<HashMap<ObjectId, ObjectHeader>>,
}

impl<'a> RemoteObjects<'a> {
    /// The objects of `remote`, read through `repo`'s store where it holds them.
    pub(super) fn new(repo: &'a Repo, remote: &'a dyn Remote) -> RemoteObjects<'a> {
        RemoteObjects { repo, remote, headers: Mutex::new(HashMap::new()) }
    }

    /// The node of object `id`, whatever its kind: the header tells (an object no referrer
    /// names, as remote gc's young roots). A blob's header is kept for the edges read next.
    pub(super) fn node_of(&self, id: &ObjectId) -> Result<Node> {
        let header = Objects::header(self, id)?;
        if header.kind == ObjectKind::Blob {
            self.headers.lock().unwrap_or_else(|e| e.into_inner()).insert(*id, header);
        }
        Ok(Node::of_kind(header.kind, *id))
    }

    fn data(&self, id: &ObjectId, kind: ObjectKind) -> Result<Vec<u8>> {
        Ok(download_data(self.repo, self.remote, id, kind)?.1)
    }
}

impl Objects for RemoteObjects<'_> {
    type Error = Error;

    fn version(&self, id: &VersionId) -> Result<Version> {
        if self.repo.store().contains(id) {
            return Ok(self.repo.version(id)?);
        }
        Ok(Version::parse(*id, &self.data(id, ObjectKind::Version)?)?)
    }

    fn manifest(&self, id: &ObjectId) -> Result<Manifest> {
        if self.repo.store().contains(id) {
            return Ok(self.repo.manifest(id)?);
        }
        Ok(Manifest::parse(*id, &self.data(id, ObjectKind::Manifest)?)?)
    }

    fn header(&self, id: &ObjectId) -> Result<ObjectHeader> {
        if let Some(header) = self.headers.lock().unwrap_or_else(|e| e.into_inner()).remove(id) {
            return Ok(header);
        }
        let missing = || remote::Error::NotFound { remote: self.remote.url().to_string(), key: remote::object_key(id) };
        Ok(remote_header(self.remote, id)?.ok_or_else(missing)?.0)
    }
}

/// The blobs of the remote's branch tips, except the branches `except` names (those a push
/// moves, the tip a save follows): a recode leaves them whole, so that a clone of another
/// branch still finds its newest version whole. Each tip's version and manifests are read
/// through `objects`. An error: a ref or a tip could not be read (the caller then recodes
/// nothing: no recode could be shown to spare that tip).
pub(super) fn tip_blobs(objects: &RemoteObjects, except: &dyn Fn(&RemoteRef) -> bool) -> Result<HashSet<ObjectId>> {
    let mut blobs = HashSet::new();
    for tip in remote_refs(objects.remote, None)? {
        if tip.kind != RefKind::Branch || except(&tip) {
            continue;
        }
        for file in graph::edges(objects, Node::Version(tip.id))?.into_iter().filter(|n| matches!(n, Node::Manifest(_)))
        {
            blobs.extend(graph::edges(objects, file)?.iter().map(Node::id));
        }
    }
    Ok(blobs)
}
