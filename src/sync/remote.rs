//! Remotes from the repository's side: the remote list (`.ckpt/remotes`), push, fetch, pull and
//! clone. The [`crate::remote`] layer moves bytes; this module decides which objects move, in
//! which order, and checks everything it receives with the store's own verification before it
//! enters the local store.
//!
//! Invariants (docs/format.md, "Remotes"):
//! - On either side, an object is present only once everything it needs is: push uploads a
//!   delta's reference before the delta and every object before any ref; fetch imports blobs
//!   bases first, then manifests, then versions parents first, then moves refs. So an
//!   interrupted push or fetch leaves both sides valid, and a rerun skips what arrived.
//! - A remote ref moves by compare-and-swap against the state the pusher read, and only
//!   forward (the old version must be an ancestor of the new): otherwise the push is rejected.

use super::partial::check_pushable;
use super::wire_delta::{plan_wire_deltas, WireDelta};
use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::remote::{self, Expect, Remote, S3Options, UploadMode, Uploaded};
use crate::repo::Error as RepoError;
use crate::repo::{check_name, Head, Needed, RefKind, Repo, VersionId, WriterLock};
use crate::store::{ObjectKind, HEADER_LEN};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The list of remotes, a JSON object NAME → [`RemoteConfig`].
const REMOTES_FILE: &str = "remotes";

/// Largest object a fetch accepts (a blob is at most a whole tensor, plus its container).
const MAX_OBJECT_LEN: u64 = 1 << 40;

/// One configured remote.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// `s3://bucket/prefix`, `file:///path` or a directory path.
    pub url: String,
    /// S3 settings stored with the remote (never credentials).
    #[serde(default, skip_serializing_if = "is_default")]
    pub s3: S3Options,
}

fn is_default(o: &S3Options) -> bool {
    *o == S3Options::default()
}

/// What `push` should send.
#[derive(Clone, Debug, Default)]
pub struct PushOptions {
    /// Branches and tags to push by name (a name is looked up as a branch, then a tag). Empty:
    /// the current branch.
    pub refs: Vec<String>,
    /// Every branch and tag.
    pub all: bool,
    /// Transfers in flight at once (at least 1).
    pub transfers: usize,
}

/// What happened to one ref.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RefUpdate {
    /// `branch` or `tag`.
    pub kind: &'static str,
    /// Its name.
    pub name: String,
    /// Where it was (on the remote for a push, locally for a fetch), if anywhere.
    pub old: Option<VersionId>,
    /// Where it is now.
    pub new: VersionId,
}

/// What a push did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PushReport {
    /// The remote's URL.
    pub remote: String,
    /// Refs moved or created.
    pub updated: Vec<RefUpdate>,
    /// Refs already where they should be.
    pub up_to_date: Vec<String>,
    /// Objects uploaded.
    pub objects_sent: u64,
    /// Bytes uploaded.
    pub bytes_sent: u64,
    /// Objects the pushed versions need that the remote already had (found by listing, or
    /// found present on upload).
    pub objects_present: u64,
    /// Of `objects_sent`, blobs sent as XOR deltas against a blob the remote already had
    /// (docs/format.md, "Remotes": deltas on the wire).
    pub objects_sent_as_deltas: u64,
    /// Requests sent to the remote.
    pub requests: u64,
    /// Versions a remote ref named whose version object or manifests the remote lacked: their
    /// missing objects were uploaded again (hex ids).
    pub repaired: Vec<String>,
}

/// What a fetch did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FetchReport {
    /// The remote's URL.
    pub remote: String,
    /// Remote-tracking refs (branches) and tags created or moved.
    pub updated: Vec<RefUpdate>,
    /// Objects downloaded and stored.
    pub objects_received: u64,
    /// Bytes downloaded.
    pub bytes_received: u64,
    /// Requests sent to the remote.
    pub requests: u64,
}

/// What `pull` did to the current branch.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PullOutcome {
    /// Already at the remote's version.
    UpToDate,
    /// The branch holds versions the remote lacks and nothing new came: push them.
    Ahead,
    /// The branch had diverged and was rebased (`pull --rebase`): its own versions now sit on
    /// top of the remote's, with the same files.
    Rebased {
        /// The old tip.
        from: VersionId,
        /// The remote's version it now builds on.
        onto: VersionId,
        /// The new tip.
        to: VersionId,
    },
    /// Moved forward (and checked out).
    FastForwarded {
        /// Where it was (`None`: the branch had no version).
        from: Option<VersionId>,
        /// Where it is.
        to: VersionId,
    },
}

/// `url` with a relative directory path (plain or `file://`) made absolute against `base`;
/// any other URL as it is.
pub fn absolute_dir_url(url: &str, base: &Path) -> String {
    let (scheme, path) = match url.strip_prefix("file://") {
        Some(p) => ("file://", p),
        None if url.contains("://") => return url.to_string(),
        None => ("", url),
    };
    if path.is_empty() || Path::new(path).is_absolute() {
        return url.to_string();
    }
    let joined = base.join(path);
    match joined.to_str() {
        Some(p) => format!("{scheme}{p}"),
        None => url.to_string(),
    }
}

fn ref_key(kind: RefKind, name: &str) -> String {
    match kind {
        RefKind::Branch => format!("refs/heads/{name}"),
        RefKind::Tag => format!("refs/tags/{name}"),
    }
}

fn parse_ref(remote: &dyn Remote, key: &str, bytes: &[u8]) -> Result<VersionId> {
    let bad = || Error::BadRemoteRef { remote: remote.url().to_string(), key: key.to_string() };
    let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
    let hex = text.strip_suffix('\n').ok_or_else(bad)?;
    hex.parse::<ObjectId>().ok().filter(|id| id.to_hex() == hex).ok_or_else(bad)
}

/// Where a fetch downloads, without the writer lock: `.ckpt/incoming/fetch-XXXX/`, a
/// directory of its own that gc and `clean_tmp` do not know about (so they cannot delete what
/// is arriving), on the store's file system (so a verified object is stored by a rename).
/// A lock file inside tells a live fetch's directory from one left by a killed fetch, which
/// the next fetch deletes. Dropped: the directory and what is left in it are deleted.
pub(crate) struct Staging {
    _lock: std::fs::File,
    dir: tempfile::TempDir,
}

/// Staging directories of all fetches.
const INCOMING_DIR: &str = "incoming";

impl Staging {
    pub(crate) fn create(ckpt_dir: &Path) -> Result<Staging> {
        let incoming = ckpt_dir.join(INCOMING_DIR);
        std::fs::create_dir_all(&incoming).map_err(|e| Error::Io {
            action: "creating",
            path: incoming.clone(),
            source: e,
        })?;
        // Directories of fetches that died: their lock file is not held.
        if let Ok(entries) = std::fs::read_dir(&incoming) {
            for entry in entries.flatten() {
                let path = entry.path();
                // A lock file that is not held; or none at all a minute after the directory
                // was made (a fetch creates it right after its directory).
                let abandoned = match std::fs::File::open(path.join("lock")) {
                    Ok(f) => f.try_lock().is_ok(),
                    Err(_) => entry
                        .metadata()
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age > std::time::Duration::from_secs(60)),
                };
                if abandoned && path.is_dir() {
                    let _ = std::fs::remove_dir_all(&path);
                }
            }
        }
        let dir = tempfile::Builder::new().prefix("fetch-").tempdir_in(&incoming).map_err(|e| Error::Io {
            action: "creating a directory in",
            path: incoming.clone(),
            source: e,
        })?;
        let lock_path = dir.path().join("lock");
        let lock = std::fs::File::create(&lock_path).and_then(|f| f.lock().map(|()| f)).map_err(|e| Error::Io {
            action: "locking",
            path: lock_path,
            source: e,
        })?;
        Ok(Staging { _lock: lock, dir })
    }
}

/// What the network half of a fetch downloaded (temp files in a [`Staging`] directory).
#[derive(Default)]
struct Staged {
    /// Versions with their parents (the content is parsed again when stored: a fetch of a
    /// long history holds no more than one version's content at a time).
    versions: Vec<(VersionId, Vec<VersionId>, tempfile::TempPath)>,
    /// Manifests (checked against their ids).
    manifests: Vec<(ObjectId, tempfile::TempPath)>,
    /// Blobs (not checked yet) with the reference their header names.
    blobs: HashMap<ObjectId, (tempfile::TempPath, Option<ObjectId>)>,
    /// Versions whose parents stay behind (a partial clone's depth).
    cut: Vec<VersionId>,
    /// Objects the walk found already stored here and so did not download: they must still
    /// be here when the lock is taken.
    assumed: Vec<ObjectId>,
    /// Bytes downloaded.
    bytes: u64,
}

/// Attempts at an object upload or download (the backend's own retries come first; these
/// cover what it does not retry, such as a connection dropped in the middle of a PUT).
const OBJECT_ATTEMPTS: u32 = 4;

/// Runs `f` until it succeeds, up to [`OBJECT_ATTEMPTS`] times, backing off (0.2, 0.4, 0.8 s)
/// after a transport or server error. Safe for objects only: an object key's content is fixed
/// by its id, so a repeated upload is create-if-absent (finding the first one's bytes there
/// is success) and a repeated download starts a fresh temp file.
pub(crate) fn with_retries<T>(mut f: impl FnMut() -> Result<T>) -> Result<T> {
    let mut attempt = 1;
    loop {
        match f() {
            Err(Error::Remote(remote::Error::Backend { .. })) if attempt < OBJECT_ATTEMPTS => {
                std::thread::sleep(std::time::Duration::from_millis(100 << attempt));
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Moves the remote ref `key` to `id` by compare-and-swap against `expect`. A failed put is
/// ambiguous (a dropped connection or a timeout may come after the server moved the ref), so
/// the ref is read back: if it holds `id`, the put took effect; if it is still as `expect`
/// says, the put is tried again (up to [`OBJECT_ATTEMPTS`] times; the compare-and-swap keeps
/// that safe); if it changed, that is [`remote::Error::Conflict`].
fn put_ref(remote: &dyn Remote, key: &str, id: &VersionId, expect: &Expect) -> remote::Result<()> {
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

/// Runs `work` on every item with `transfers` threads; the first error stops the others from
/// taking new items and is returned.
fn parallel<T: Sync>(items: &[T], transfers: usize, work: impl Fn(&T) -> Result<()> + Sync) -> Result<()> {
    let next = AtomicUsize::new(0);
    let error: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..transfers.clamp(1, items.len().max(1)) {
            scope.spawn(|| loop {
                if error.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                if let Err(e) = work(item) {
                    error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
                    break;
                }
            });
        }
    });
    match error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

// ---- the remote list ------------------------------------------------------------------

/// The configured remotes, by name.
pub fn remotes(repo: &Repo) -> Result<BTreeMap<String, RemoteConfig>> {
    let path = repo.ckpt_dir().join(REMOTES_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| Error::from(RepoError::Config { path: path.clone(), reason: format!("remotes: {e}") })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(source) => Err(Error::Io { action: "reading", path, source }),
    }
}

fn write_remotes(repo: &Repo, remotes: &BTreeMap<String, RemoteConfig>) -> Result<()> {
    let mut text = serde_json::to_string_pretty(remotes).expect("remotes serialize");
    text.push('\n');
    Ok(repo.refs().write(&repo.ckpt_dir().join(REMOTES_FILE), &text)?)
}

/// Adds remote `name` at `url` (checked by opening it: a directory remote is created). A
/// relative directory path is stored made absolute against the current directory; a URL
/// with credentials in it (user information, a query string) is refused
/// ([`remote::check_no_secrets`]).
pub fn add_remote(repo: &Repo, name: &str, url: &str, s3: S3Options) -> Result<()> {
    check_name(name)?;
    let _lock = repo.lock()?;
    let mut remotes = remotes(repo)?;
    if remotes.contains_key(name) {
        return Err(Error::RemoteExists { name: name.into() });
    }
    remote::check_no_secrets(url)?;
    if let Some(endpoint) = &s3.endpoint {
        remote::check_no_secrets(endpoint)?;
    }
    let cwd = std::env::current_dir().map_err(|e| Error::Io { action: "reading", path: ".".into(), source: e })?;
    let url = &absolute_dir_url(url, &cwd);
    let config = RemoteConfig { url: url.to_string(), s3 };
    if url.starts_with("s3://") || url.contains("://") && !url.starts_with("file://") {
        // Checks the URL; an S3 remote is not contacted (the credentials may only be set
        // where it is used).
        remote::open(url, &config.s3)?;
    } else {
        // A directory remote is created now (as `git init --bare` would).
        remote::local::DirRemote::create(url)?;
    }
    remotes.insert(name.to_string(), config);
    write_remotes(repo, &remotes)
}

/// Removes remote `name` and its remote-tracking refs.
pub fn remove_remote(repo: &Repo, name: &str) -> Result<()> {
    let _lock = repo.lock()?;
    let mut remotes = remotes(repo)?;
    if remotes.remove(name).is_none() {
        return Err(Error::NoSuchRemote { name: name.into() });
    }
    write_remotes(repo, &remotes)?;
    Ok(repo.refs().remove_remote(name)?)
}

/// Opens the remote `name`.
pub fn open_remote(repo: &Repo, name: &str) -> Result<Box<dyn Remote>> {
    let remotes = remotes(repo)?;
    let config = remotes.get(name).ok_or_else(|| Error::NoSuchRemote { name: name.into() })?;
    // A relative directory path (stored by an older ckpt) means the same wherever the
    // command runs: relative to the working tree's root.
    Ok(remote::open(&absolute_dir_url(&config.url, repo.root()), &config.s3)?)
}

/// The remote a command uses when none is named: `origin`, or the only one.
pub fn default_remote(repo: &Repo) -> Result<String> {
    let remotes = remotes(repo)?;
    if remotes.contains_key("origin") || remotes.len() != 1 {
        return Ok("origin".into());
    }
    Ok(remotes.into_keys().next().expect("one remote"))
}

// ---- push -----------------------------------------------------------------------------

/// Pushes refs to the remote `name` (see [`push_to`]) and records where its branches
/// now are (`refs/remotes/NAME/BRANCH`).
pub fn push(repo: &Repo, name: &str, options: &PushOptions) -> Result<PushReport> {
    let remote = open_remote(repo, name)?;
    let report = push_to(repo, remote.as_ref(), options)?;
    for update in report.updated.iter().filter(|u| u.kind == "branch") {
        repo.refs().set_remote(name, &update.name, &update.new)?;
    }
    // Also where the remote already had the branch: an earlier push may have moved it
    // without learning so (its answer lost), leaving the remote-tracking ref behind.
    for branch in report.up_to_date.iter().filter_map(|what| what.strip_prefix("branch ")) {
        if let Some(id) = repo.refs().get(RefKind::Branch, branch)? {
            repo.refs().set_remote(name, branch, &id)?;
        }
    }
    Ok(report)
}

/// Pushes refs to `remote`: the objects their versions need that the remote lacks, then
/// each ref by compare-and-swap. A branch moves only forward from where the remote has it,
/// a tag is never moved; otherwise, or if the ref changed on the remote during the push,
/// the push is rejected ("fetch first") and the remote ref left as it was.
pub fn push_to(repo: &Repo, remote: &dyn Remote, options: &PushOptions) -> Result<PushReport> {
    let url = remote.url().to_string();
    let mut wanted: Vec<(RefKind, String, VersionId)> = Vec::new();
    if options.all {
        for (name, id) in repo.refs().list(RefKind::Branch)? {
            wanted.push((RefKind::Branch, name, id));
        }
        for (name, id) in repo.refs().list(RefKind::Tag)? {
            wanted.push((RefKind::Tag, name, id));
        }
    } else if options.refs.is_empty() {
        let Head::Branch(branch) = repo.refs().head()? else {
            return Err(Error::from(RepoError::UnknownRevision {
                rev: "HEAD".into(),
                reason: "detached: name the branch or tag to push".into(),
            }));
        };
        let id = repo.refs().get(RefKind::Branch, &branch)?.ok_or_else(|| {
            Error::from(RepoError::UnknownRevision {
                rev: branch.clone(),
                reason: "the branch has no version yet".into(),
            })
        })?;
        wanted.push((RefKind::Branch, branch, id));
    } else {
        for name in &options.refs {
            if let Some(id) = repo.refs().get(RefKind::Branch, name)? {
                wanted.push((RefKind::Branch, name.clone(), id));
            } else if let Some(id) = repo.refs().get(RefKind::Tag, name)? {
                wanted.push((RefKind::Tag, name.clone(), id));
            } else {
                return Err(Error::from(RepoError::UnknownRevision {
                    rev: name.clone(),
                    reason: "not a branch or tag".into(),
                }));
            }
        }
    }

    // Where each ref is on the remote, and the tag to compare-and-swap against.
    let mut report = PushReport { remote: url.clone(), ..PushReport::default() };
    let mut moves = Vec::new();
    let mut remote_known: Vec<VersionId> = Vec::new();
    for (kind, name, id) in wanted {
        let key = ref_key(kind, &name);
        let current = remote.get_small(&key)?;
        let old = match &current {
            Some(small) => Some(parse_ref(remote, &key, &small.bytes)?),
            None => None,
        };
        let what = format!("{} {name}", kind.name());
        match old {
            Some(old) if old == id => {
                report.up_to_date.push(what);
                remote_known.push(old);
                continue;
            }
            Some(_) if kind == RefKind::Tag => {
                return Err(Error::Rejected {
                    remote: url,
                    what,
                    reason: "the remote has this tag at another version (tags do not move)".into(),
                });
            }
            Some(old) => {
                let known = repo.store().contains(&old);
                if !known || !repo.is_ancestor(&old, &id)? {
                    return Err(Error::Rejected {
                        remote: url,
                        what,
                        reason: format!(
                            "fetch first: the remote has version {} there, which {}",
                            old.short(12),
                            if known { "is not an ancestor of yours" } else { "you do not have" }
                        ),
                    });
                }
                remote_known.push(old);
            }
            None => {}
        }
        let expect = match current {
            Some(small) => Expect::Tag(small.tag),
            None => Expect::Absent,
        };
        moves.push((kind, name, key, old, id, expect));
    }
    // A remote ref's version is taken as complete only if the remote still has its version
    // object and manifests (a HEAD each): a remote that lost one (a failed copy, a
    // lifecycle rule, a hand-made ref) would otherwise stay unreadable while every push
    // says "up to date". An incomplete one is pushed again like a new version: its
    // objects the remote lacks (found by listing) go up.
    remote_known.sort();
    remote_known.dedup();
    let mut incomplete = Vec::new();
    for id in &remote_known {
        if !remote_has_version(repo, remote, id)? {
            incomplete.push(*id);
        }
    }
    remote_known.retain(|id| !incomplete.contains(id));
    report.repaired = incomplete.iter().map(|id| id.to_hex()).collect();
    if moves.is_empty() && incomplete.is_empty() {
        report.requests = remote.requests();
        return Ok(report);
    }

    // What the pushed versions need, less what the remote's refs already name (the remote
    // holds all of that, each with its chain: refs move only after their objects). Not
    // less the local chains of those blobs: after a compaction here, an old blob is a delta
    // against a new one, which the remote does not have.
    let have: HashSet<ObjectId> = repo.named(&remote_known)?.into_iter().map(|n| n.id).collect();
    let roots: Vec<VersionId> = moves.iter().map(|m| m.4).chain(incomplete.iter().copied()).collect();
    let mut need = repo.reachable(&roots, &|id| have.contains(id))?;
    let mut present: HashSet<ObjectId> = HashSet::new();
    if !need.is_empty() {
        // Objects a previous, interrupted push left there (one listing, not a request per
        // object).
        present = remote.list("objects/")?.iter().filter_map(|k| remote::object_of_key(k)).collect();
        let before = need.len();
        need.retain(|n| !present.contains(&n.id));
        report.objects_present += (before - need.len()) as u64;
    }
    check_pushable(repo, &need, &|id| have.contains(id) || present.contains(id), &url)?;
    // New blobs go up as deltas against the parent version's blobs where the remote has
    // them (remote_delta.rs).
    let versions: Vec<VersionId> = need.iter().filter(|n| n.kind == ObjectKind::Version).map(|n| n.id).collect();
    let need_blobs: HashSet<ObjectId> = need.iter().filter(|n| n.kind == ObjectKind::Blob).map(|n| n.id).collect();
    let wire = plan_wire_deltas(repo, &versions, &need_blobs, &|id| have.contains(id) || present.contains(id))?;
    upload(repo, remote, &need, &wire, options.transfers, &mut report)?;

    for (kind, name, key, old, id, expect) in moves {
        match put_ref(remote, &key, &id, &expect) {
            Ok(()) => report.updated.push(RefUpdate { kind: kind.name(), name, old, new: id }),
            Err(remote::Error::Conflict { .. }) => {
                return Err(Error::Rejected {
                    remote: url,
                    what: format!("{} {name}", kind.name()),
                    reason: "fetch first: it changed on the remote during this push".into(),
                })
            }
            Err(e) => return Err(e.into()),
        }
    }
    report.requests = remote.requests();
    Ok(report)
}

/// Whether `remote` has version `id`'s object and the manifests of its files (the
/// manifests only if the version object is there).
fn remote_has_version(repo: &Repo, remote: &dyn Remote, id: &VersionId) -> Result<bool> {
    if !remote.exists(&remote::object_key(id))? {
        return Ok(false);
    }
    let version = repo.version(id)?;
    let mut manifests: Vec<ObjectId> = version.files.iter().map(|f| f.manifest).collect();
    manifests.sort();
    manifests.dedup();
    for m in manifests {
        if !remote.exists(&remote::object_key(&m))? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Uploads `need`, a delta's reference before the delta (by levels: objects with no
/// reference to upload first, then the deltas on them, ...), each level in parallel.
fn upload(
    repo: &Repo,
    remote: &dyn Remote,
    need: &[Needed],
    wire: &HashMap<ObjectId, WireDelta>,
    transfers: usize,
    report: &mut PushReport,
) -> Result<()> {
    let index: HashMap<ObjectId, &Needed> = need.iter().map(|n| (n.id, n)).collect();
    let mut level: HashMap<ObjectId, usize> = HashMap::new();
    for n in need {
        // Follow the chain down to the first reference not being uploaded.
        let mut chain = vec![n.id];
        let mut base_level = 0;
        while let Some(r) = index.get(chain.last().expect("non-empty")).and_then(|m| m.reference) {
            if let Some(l) = level.get(&r) {
                base_level = l + 1;
                break;
            }
            if !index.contains_key(&r) || chain.len() > crate::store::MAX_CHAIN_DEPTH as usize + 1 {
                break;
            }
            chain.push(r);
        }
        let deepest = chain.len() - 1;
        for (i, id) in chain.iter().enumerate() {
            level.entry(*id).or_insert(base_level + deepest - i);
        }
    }
    let mut levels: BTreeMap<usize, Vec<ObjectId>> = BTreeMap::new();
    for n in need {
        levels.entry(level[&n.id]).or_default().push(n.id);
    }
    let total: u64 = need.iter().map(|n| repo.store().stored_len(&n.id).unwrap_or(0)).sum();
    repo.progress().start("push", total);
    let done = AtomicU64::new(0);
    let sent = AtomicU64::new(0);
    let sent_bytes = AtomicU64::new(0);
    let existed = AtomicU64::new(0);
    let as_deltas = AtomicU64::new(0);
    for ids in levels.values() {
        parallel(ids, transfers, |id| {
            if let Some(plan) = wire.get(id) {
                if let Some((len, uploaded)) = upload_wire_delta(repo, remote, id, plan)? {
                    match uploaded {
                        Uploaded::Created => {
                            sent.fetch_add(1, Ordering::Relaxed);
                            sent_bytes.fetch_add(len, Ordering::Relaxed);
                            as_deltas.fetch_add(1, Ordering::Relaxed);
                        }
                        Uploaded::Existed => {
                            existed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    let whole = repo.store().stored_len(id).unwrap_or(len);
                    repo.progress().set(done.fetch_add(whole, Ordering::Relaxed) + whole);
                    return Ok(());
                }
            }
            let (len, uploaded) = upload_object(repo, remote, id)?;
            match uploaded {
                Uploaded::Created => {
                    sent.fetch_add(1, Ordering::Relaxed);
                    sent_bytes.fetch_add(len, Ordering::Relaxed);
                }
                Uploaded::Existed => {
                    existed.fetch_add(1, Ordering::Relaxed);
                }
            }
            repo.progress().set(done.fetch_add(len, Ordering::Relaxed) + len);
            Ok(())
        })?;
    }
    repo.progress().finish();
    report.objects_sent += sent.into_inner();
    report.bytes_sent += sent_bytes.into_inner();
    report.objects_present += existed.into_inner();
    report.objects_sent_as_deltas += as_deltas.into_inner();
    Ok(())
}

/// Uploads one object file as it is now; returns its length and whether it was created.
pub(crate) fn upload_object(repo: &Repo, remote: &dyn Remote, id: &ObjectId) -> Result<(u64, Uploaded)> {
    let path = repo.store().object_path(id);
    let io = |action| {
        let path = path.clone();
        move |source| Error::Io { action, path, source }
    };
    let mut file = std::fs::File::open(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::Store(crate::store::Error::Missing { id: *id }),
        _ => Error::Io { action: "opening", path: path.clone(), source: e },
    })?;
    let len = file.metadata().map_err(io("reading"))?.len();
    // The header of the very file that goes up decides whether it may replace (a
    // compaction may rename a delta over the path meanwhile; the open file stays as read).
    let mut head = Vec::with_capacity(HEADER_LEN);
    (&mut file).take(HEADER_LEN as u64).read_to_end(&mut head).map_err(io("reading"))?;
    let header = crate::store::ObjectHeader::decode(*id, &head)?;
    let mode = if header.reference.is_none() { UploadMode::MayReplace } else { UploadMode::CreateOnly };
    let uploaded = with_retries(|| Ok(remote.upload(&remote::object_key(id), &file, &path, len, mode)?))?;
    Ok((len, uploaded))
}

/// Codes blob `id` as planned and uploads it (create-only, with retries): its length on the
/// wire and whether it was created; `None` when the delta would not be smaller (the caller
/// then uploads the object as it is).
pub(crate) fn upload_wire_delta(
    repo: &Repo,
    remote: &dyn Remote,
    id: &ObjectId,
    plan: &WireDelta,
) -> Result<Option<(u64, Uploaded)>> {
    let Some((tmp, len)) = encode_wire_delta(repo, id, plan)? else { return Ok(None) };
    let uploaded = with_retries(|| {
        Ok(remote.upload(&remote::object_key(id), tmp.as_file(), tmp.path(), len, UploadMode::CreateOnly)?)
    })?;
    Ok(Some((len, uploaded)))
}

/// Codes blob `id` as planned (a delta against a blob the remote holds) into a temp file;
/// `None` when that would not be smaller than its object here (it then goes up as it is).
pub(crate) fn encode_wire_delta(
    repo: &Repo,
    id: &ObjectId,
    plan: &WireDelta,
) -> Result<Option<(tempfile::NamedTempFile, u64)>> {
    let target = repo.store().open_blob(id)?;
    let reference = repo.store().open_blob(&plan.reference)?;
    let limit = target.stored_len();
    match repo.store().encode_delta_for_transfer(&target, &reference, plan.depth, limit, &repo.config().codec_options())
    {
        Ok(done) => Ok(done),
        // A pair the coder refuses (another chunk size since a config change): sent whole.
        Err(crate::store::Error::Encode { source: crate::codec::Error::InvalidInput(reason), .. })
            if !reason.starts_with("writing") =>
        {
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

// ---- fetch ----------------------------------------------------------------------------

/// Fetches from the remote `name`: every version its branches and tags reach that is not
/// here, verified object by object; then `refs/remotes/NAME/BRANCH` for its branches, and
/// its tags as local tags where no local tag of that name exists.
pub fn fetch(repo: &Repo, name: &str, transfers: usize) -> Result<FetchReport> {
    let remote = open_remote(repo, name)?;
    fetch_from(repo, remote.as_ref(), name, transfers)
}

/// [`fetch`] from an opened remote, recorded under the remote name `name`.
pub fn fetch_from(repo: &Repo, remote: &dyn Remote, name: &str, transfers: usize) -> Result<FetchReport> {
    fetch_refs(repo, remote, name, transfers, None, None)
}

/// [`fetch_from`]; with `only_branch`, that branch alone (no tags), and with `depth`
/// only its newest `depth` versions (partial.rs).
fn fetch_refs(
    repo: &Repo,
    remote: &dyn Remote,
    name: &str,
    transfers: usize,
    only_branch: Option<&str>,
    depth: Option<usize>,
) -> Result<FetchReport> {
    check_name(name)?;
    let mut report = FetchReport { remote: remote.url().to_string(), ..FetchReport::default() };
    let mut refs: Vec<(RefKind, String, VersionId)> = Vec::new();
    let mut keys = remote.list("refs/")?;
    keys.sort();
    for key in keys {
        let (kind, ref_name) = if let Some(n) = key.strip_prefix("refs/heads/") {
            (RefKind::Branch, n)
        } else if let Some(n) = key.strip_prefix("refs/tags/") {
            (RefKind::Tag, n)
        } else {
            continue;
        };
        if check_name(ref_name).is_err() {
            continue;
        }
        if only_branch.is_some_and(|b| kind != RefKind::Branch || b != ref_name) {
            continue;
        }
        let Some(small) = remote.get_small(&key)? else { continue };
        refs.push((kind, ref_name.to_string(), parse_ref(remote, &key, &small.bytes)?));
    }
    let roots: Vec<VersionId> = refs.iter().map(|r| r.2).filter(|id| !repo.store().contains(id)).collect();
    // The transfer runs without the writer lock (commits go on meanwhile); the lock is
    // taken to store what arrived and move the refs.
    let _lock = download_then_lock(repo, remote, &roots, transfers, &mut report, depth, name)?;
    // A ref's version already here when listed may have been deleted by a gc since.
    let gone: Vec<VersionId> = refs.iter().map(|r| r.2).filter(|id| !repo.store().contains(id)).collect();
    if !gone.is_empty() {
        download(repo, remote, &gone, transfers, &mut report, depth, name)?;
    }

    for (kind, ref_name, id) in refs {
        match kind {
            RefKind::Branch => {
                let old = repo.refs().get_remote(name, &ref_name)?;
                if old != Some(id) {
                    repo.refs().set_remote(name, &ref_name, &id)?;
                    report.updated.push(RefUpdate { kind: "branch", name: format!("{name}/{ref_name}"), old, new: id });
                }
            }
            RefKind::Tag => {
                if repo.refs().get(RefKind::Tag, &ref_name)?.is_none() {
                    repo.refs().set(RefKind::Tag, &ref_name, &id)?;
                    report.updated.push(RefUpdate { kind: "tag", name: ref_name, old: None, new: id });
                }
            }
        }
    }
    report.requests = remote.requests();
    Ok(report)
}

/// Downloads one object into a temp file of the store (not stored yet).
pub(crate) fn receive(
    repo: &Repo,
    remote: &dyn Remote,
    id: &ObjectId,
    received: &AtomicU64,
) -> Result<tempfile::TempPath> {
    with_retries(|| receive_once(repo, remote, id, received))
}

/// Downloads one object into `stage`, reopened for reading.
pub(crate) fn receive_staged(
    repo: &Repo,
    remote: &dyn Remote,
    id: &ObjectId,
    stage: &Staging,
) -> Result<tempfile::NamedTempFile> {
    reopen(receive_into(repo, remote, id, &AtomicU64::new(0), stage.dir.path())?)
}

fn receive_once(repo: &Repo, remote: &dyn Remote, id: &ObjectId, received: &AtomicU64) -> Result<tempfile::TempPath> {
    download_to(repo, remote, id, received, repo.store().receive_file()?)
}

/// Downloads one object into `tmp`, adds its size to `received` (and the progress), and
/// keeps only the file's name: a fetch may hold thousands of received objects at once.
fn download_to(
    repo: &Repo,
    remote: &dyn Remote,
    id: &ObjectId,
    received: &AtomicU64,
    tmp: tempfile::NamedTempFile,
) -> Result<tempfile::TempPath> {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, tmp.as_file());
    let n = remote.download(&remote::object_key(id), &mut out, MAX_OBJECT_LEN)?;
    std::io::Write::flush(&mut out).map_err(|e| Error::Io { action: "writing", path: tmp.path().into(), source: e })?;
    drop(out);
    received.fetch_add(n, Ordering::Relaxed);
    repo.progress().set(received.load(Ordering::Relaxed));
    Ok(tmp.into_temp_path())
}

pub(crate) fn reopen(path: tempfile::TempPath) -> Result<tempfile::NamedTempFile> {
    let file =
        std::fs::File::open(&path).map_err(|e| Error::Io { action: "opening", path: path.to_path_buf(), source: e })?;
    Ok(tempfile::NamedTempFile::from_parts(file, path))
}

/// Downloads what `roots` need and this store lacks, verifies every object and stores it
/// bottom-up (blobs bases first, manifests, versions parents first), so that an object
/// present here always has everything it needs and an interrupted fetch is resumed by
/// walking down from the roots again. The caller holds the writer lock (for the whole
/// transfer: used where the network is not the bottleneck, or by the git filter).
///
/// With `depth`, only versions fewer than `depth` parents away from a root are downloaded
/// (a partial clone); those whose parents stay behind are recorded as cut versions of
/// remote `remote_name` (partial.rs) before anything is stored.
pub(crate) fn download(
    repo: &Repo,
    remote: &dyn Remote,
    roots: &[VersionId],
    transfers: usize,
    report: &mut FetchReport,
    depth: Option<usize>,
    remote_name: &str,
) -> Result<()> {
    let stage = Staging::create(repo.ckpt_dir())?;
    let mut staged = Staged::default();
    if let Err(e) = download_to_stage(repo, remote, roots, transfers, depth, &stage, &mut staged) {
        keep_arrived_blobs(repo, &mut staged.blobs);
        return Err(e);
    }
    import_staged(repo, staged, report, remote_name)
}

/// Stores the staged blobs that can be stored (standalone, or with their reference here),
/// bases first, skipping any that fails: what an interrupted fetch keeps. The caller holds
/// the writer lock.
fn keep_arrived_blobs(repo: &Repo, blobs: &mut HashMap<ObjectId, (tempfile::TempPath, Option<ObjectId>)>) {
    loop {
        let ready: Vec<ObjectId> =
            blobs.iter().filter(|(_, (_, r))| r.is_none_or(|r| repo.store().contains(&r))).map(|(id, _)| *id).collect();
        if ready.is_empty() {
            break;
        }
        for id in ready {
            let (path, _) = blobs.remove(&id).expect("ready is staged");
            // Best effort: a blob that fails to store is downloaded again by the rerun.
            let _ = reopen(path).and_then(|tmp| Ok(repo.import_object(&id, ObjectKind::Blob, tmp)?));
        }
    }
    repo.flush_index();
}

/// Downloads what `roots` need into `stage`, then takes the writer lock to store it:
/// the lock is held for local work only (docs/architecture.md, "What the lock covers").
/// If something the download took as present here is gone when the lock is taken (a gc
/// ran meanwhile), the download is done again under the lock.
pub(crate) fn download_then_lock(
    repo: &Repo,
    remote: &dyn Remote,
    roots: &[VersionId],
    transfers: usize,
    report: &mut FetchReport,
    depth: Option<usize>,
    remote_name: &str,
) -> Result<WriterLock> {
    let stage = Staging::create(repo.ckpt_dir())?;
    let mut staged = Staged::default();
    if let Err(e) = download_to_stage(repo, remote, roots, transfers, depth, &stage, &mut staged) {
        // Keep the blobs that arrived (each needs nothing but its chain), so that a rerun
        // does not download them again; briefly locked, and only if the lock is free.
        if !staged.blobs.is_empty() {
            if let Some(_lock) = repo.try_lock() {
                keep_arrived_blobs(repo, &mut staged.blobs);
            }
        }
        return Err(e);
    }
    let lock = repo.lock()?;
    if staged.assumed.iter().all(|id| repo.store().contains(id)) {
        import_staged(repo, staged, report, remote_name)?;
    } else {
        // Done again under the lock: what `download` does for callers holding it.
        drop((staged, stage));
        download(repo, remote, roots, transfers, report, depth, remote_name)?;
    }
    Ok(lock)
}

/// Downloads one object into a new file in `dir` (a fetch's staging directory).
fn receive_into(
    repo: &Repo,
    remote: &dyn Remote,
    id: &ObjectId,
    received: &AtomicU64,
    dir: &Path,
) -> Result<tempfile::TempPath> {
    with_retries(|| {
        let tmp = tempfile::Builder::new().prefix("obj-").tempfile_in(dir).map_err(|e| Error::Io {
            action: "creating a file in",
            path: dir.into(),
            source: e,
        })?;
        download_to(repo, remote, id, received, tmp)
    })
}

/// The network half of a fetch, without the lock: walks down from `roots` and downloads
/// every version, manifest and blob (with the delta references it needs) this store
/// lacks into `stage`. Versions and manifests are checked against their ids and parsed
/// here (to learn what they need); blobs are checked when stored.
fn download_to_stage(
    repo: &Repo,
    remote: &dyn Remote,
    roots: &[VersionId],
    transfers: usize,
    depth: Option<usize>,
    stage: &Staging,
    staged: &mut Staged,
) -> Result<()> {
    let dir = stage.dir.path();
    let received = AtomicU64::new(0);
    repo.progress().start("fetch", 0);
    let mut blobs: Vec<ObjectId> = Vec::new();
    let mut seen: HashSet<ObjectId> = HashSet::new();
    let contains = |id: &ObjectId, assumed: &mut Vec<ObjectId>| {
        let here = repo.store().contains(id);
        if here {
            assumed.push(*id);
        }
        here
    };
    // Breadth first, so that a version's distance from the roots is its shortest.
    let mut queue: std::collections::VecDeque<(VersionId, usize)> = roots.iter().map(|r| (*r, 0)).collect();
    while let Some((id, level)) = queue.pop_front() {
        if contains(&id, &mut staged.assumed) || !seen.insert(id) {
            continue;
        }
        let tmp = reopen(receive_into(repo, remote, &id, &received, dir)?)?;
        let version = crate::repo::Version::parse(id, &repo.store().read_received(&id, ObjectKind::Version, &tmp)?)?;
        for file in &version.files {
            if contains(&file.manifest, &mut staged.assumed) || !seen.insert(file.manifest) {
                continue;
            }
            let mtmp = reopen(receive_into(repo, remote, &file.manifest, &received, dir)?)?;
            let manifest = crate::repo::Manifest::parse(
                file.manifest,
                &repo.store().read_received(&file.manifest, ObjectKind::Manifest, &mtmp)?,
            )?;
            for blob in manifest.blobs() {
                if !contains(&blob, &mut staged.assumed) && seen.insert(blob) {
                    blobs.push(blob);
                }
            }
            staged.manifests.push((file.manifest, mtmp.into_temp_path()));
        }
        if depth.is_some_and(|d| level + 1 >= d) {
            if version.parents.iter().any(|p| !repo.store().contains(p)) {
                staged.cut.push(id);
            }
        } else {
            queue.extend(version.parents.iter().map(|p| (*p, level + 1)));
        }
        staged.versions.push((id, version.parents, tmp.into_temp_path()));
    }

    // Blobs, in parallel; a delta's reference that is not here joins the next round.
    // The delta that asked for each base fetched in a later round (to name it if the base
    // is missing on the remote).
    let mut needed_by: HashMap<ObjectId, ObjectId> = HashMap::new();
    let mut round = blobs;
    while !round.is_empty() {
        let got: Mutex<Vec<(ObjectId, tempfile::TempPath, Option<ObjectId>)>> = Mutex::new(Vec::new());
        let result = parallel(&round, transfers, |id| {
            let path = match (receive_into(repo, remote, id, &received, dir), needed_by.get(id)) {
                (Err(Error::Remote(remote::Error::NotFound { .. })), Some(delta)) => {
                    return Err(crate::store::Error::Corrupt {
                        id: *delta,
                        reason: format!("its delta base {id} is missing on remote {}", remote.url()),
                    }
                    .into())
                }
                (result, _) => result?,
            };
            let tmp = reopen(path)?;
            let header = repo.store().received_header(id, &tmp)?;
            if header.kind != ObjectKind::Blob {
                return Err(
                    crate::store::Error::WrongKind { id: *id, expected: ObjectKind::Blob, found: header.kind }.into()
                );
            }
            got.lock().unwrap_or_else(|e| e.into_inner()).push((*id, tmp.into_temp_path(), header.reference));
            Ok(())
        });
        if result.is_err() {
            // What arrived stays staged for the caller (an interrupted fetch keeps it).
            for (id, path, reference) in got.into_inner().unwrap_or_else(|e| e.into_inner()) {
                staged.blobs.insert(id, (path, reference));
            }
            return result;
        }
        round = Vec::new();
        for (id, path, reference) in got.into_inner().unwrap_or_else(|e| e.into_inner()) {
            if let Some(r) = reference {
                if !contains(&r, &mut staged.assumed) && seen.insert(r) {
                    round.push(r);
                    needed_by.insert(r, id);
                }
            }
            staged.blobs.insert(id, (path, reference));
        }
    }
    staged.bytes = received.into_inner();
    repo.progress().finish();
    Ok(())
}

/// The local half of a fetch (the caller holds the writer lock): records cut versions,
/// then stores the staged objects bottom-up, each verified (blobs through their chains,
/// bases first), so that an object present here always has everything it needs.
fn import_staged(repo: &Repo, staged: Staged, report: &mut FetchReport, remote_name: &str) -> Result<()> {
    let Staged { versions, manifests, blobs: mut pending, cut, bytes, assumed: _ } = staged;
    if !cut.is_empty() {
        repo.add_cut(remote_name, &cut)?;
    }
    let stored = AtomicU64::new(0);
    while !pending.is_empty() {
        let ready: Vec<ObjectId> = pending
            .iter()
            .filter(|(_, (_, r))| r.is_none_or(|r| !pending.contains_key(&r)))
            .map(|(id, _)| *id)
            .collect();
        if ready.is_empty() {
            let id = *pending.keys().next().expect("non-empty");
            return Err(
                crate::store::Error::Corrupt { id, reason: "its delta chain on the remote is a cycle".into() }.into()
            );
        }
        let batch: Vec<(ObjectId, Mutex<Option<tempfile::TempPath>>)> =
            ready.iter().map(|id| (*id, Mutex::new(Some(pending.remove(id).expect("ready is pending").0)))).collect();
        parallel(&batch, rayon::current_num_threads(), |(id, slot)| {
            let path = slot.lock().unwrap_or_else(|e| e.into_inner()).take().expect("each item once");
            repo.import_object(id, ObjectKind::Blob, reopen(path)?)?;
            stored.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })?;
    }
    let mut stored_objects = stored.into_inner();
    for (id, path) in manifests {
        repo.import_object(&id, ObjectKind::Manifest, reopen(path)?)?;
        stored_objects += 1;
    }
    // Versions, parents first.
    let mut left: HashMap<VersionId, (Vec<VersionId>, tempfile::TempPath)> =
        versions.into_iter().map(|(id, parents, path)| (id, (parents, path))).collect();
    while !left.is_empty() {
        let ready: Vec<VersionId> = left
            .iter()
            .filter(|(_, (parents, _))| parents.iter().all(|p| !left.contains_key(p)))
            .map(|(id, _)| *id)
            .collect();
        if ready.is_empty() {
            let id = *left.keys().next().expect("non-empty");
            return Err(Error::from(RepoError::CorruptMetadata {
                id,
                reason: "its history on the remote is a cycle".into(),
            }));
        }
        for id in ready {
            let (_, path) = left.remove(&id).expect("ready is left");
            let tmp = reopen(path)?;
            let version =
                crate::repo::Version::parse(id, &repo.store().read_received(&id, ObjectKind::Version, &tmp)?)?;
            repo.import_version(&id, &version, tmp)?;
            stored_objects += 1;
        }
    }
    report.objects_received += stored_objects;
    report.bytes_received += bytes;
    repo.flush_index();
    Ok(())
}

// ---- pull and clone -------------------------------------------------------------------

/// Fetches from `name` and moves the current branch to the remote's branch of the same
/// name if that is a fast-forward, checking its files out (refusing, like `switch`, when a
/// tracked file is modified). A diverged branch is an error that says what to do.
///
/// With `rebase`, a diverged branch is rebased instead: each of its versions the remote
/// lacks (along first parents, oldest first) becomes a new version with the same files
/// and message on top of the remote's, so the working tree is unchanged and the branch
/// can be pushed. Versions are snapshots, so this is exact: nothing is merged.
pub fn pull(repo: &Repo, name: &str, transfers: usize, rebase: bool) -> Result<(FetchReport, PullOutcome)> {
    let report = fetch(repo, name, transfers)?;
    let Head::Branch(branch) = repo.refs().head()? else {
        return Err(Error::from(RepoError::UnknownRevision {
            rev: "HEAD".into(),
            reason: "detached: switch to a branch to pull".into(),
        }));
    };
    let theirs = repo.refs().get_remote(name, &branch)?.ok_or_else(|| {
        Error::from(RepoError::UnknownRevision {
            rev: format!("{name}/{branch}"),
            reason: format!("remote {name:?} has no branch {branch:?}"),
        })
    })?;
    let _lock = repo.lock()?;
    let local = repo.refs().get(RefKind::Branch, &branch)?;
    let outcome = match local {
        Some(l) if l == theirs => PullOutcome::UpToDate,
        Some(l) if repo.is_ancestor(&theirs, &l)? => PullOutcome::Ahead,
        Some(l) if !repo.is_ancestor(&l, &theirs)? => {
            if !rebase {
                return Err(Error::Diverged { branch, remote: name.into(), local: l, theirs });
            }
            let to = rebase_onto(repo, &l, &theirs)?;
            repo.refs().set(RefKind::Branch, &branch, &to)?;
            repo.flush_index();
            PullOutcome::Rebased { from: l, onto: theirs, to }
        }
        _ => {
            // As `switch` does: refuses (naming them) to overwrite modified or untracked files
            // and removes the files the new tip no longer holds.
            // (`pull` has no --force: the message says what to do instead.)
            repo.check_out(&theirs, true).map_err(|e| match e {
                RepoError::DirtyWorkingTree { paths, untracked } => {
                    Error::PullBlocked { branch: branch.clone(), theirs: format!("{name}/{branch}"), paths, untracked }
                }
                e => Error::Repo(e),
            })?;
            repo.refs().set(RefKind::Branch, &branch, &theirs)?;
            PullOutcome::FastForwarded { from: local, to: theirs }
        }
    };
    Ok((report, outcome))
}

/// Rewrites the versions from `tip` back along first parents to (excluding) the first one
/// `onto` already has, as new versions on top of `onto`; returns the new tip.
fn rebase_onto(repo: &Repo, tip: &VersionId, onto: &VersionId) -> Result<VersionId> {
    let mut chain = Vec::new();
    let mut next = Some(*tip);
    while let Some(id) = next {
        if repo.is_ancestor(&id, onto)? {
            break;
        }
        let version = repo.version(&id)?;
        next = version.parents.first().copied();
        chain.push(version);
    }
    let base_every = repo.config().base_every.max(1);
    let mut parent = *onto;
    let mut parent_since_base = repo.version(onto)?.since_base;
    for old in chain.into_iter().rev() {
        let since_base = if parent_since_base + 1 < base_every { parent_since_base + 1 } else { 0 };
        let version = crate::repo::Version {
            parents: vec![parent],
            since_base,
            // The objects are shared with the old version: this one adds none.
            stored_bytes: 0,
            ..old
        };
        parent = repo.record_version(&version)?;
        parent_since_base = since_base;
    }
    Ok(parent)
}

/// Clones: creates a repository in `dir`, adds `url` as remote `origin`, fetches it and
/// checks out its `main` branch (or its first branch), which becomes the current branch.
/// Progress of the download goes to `progress`.
pub fn clone_from(
    url: &str,
    dir: &Path,
    s3: S3Options,
    transfers: usize,
    progress: Option<std::sync::Arc<dyn crate::repo::Progress>>,
) -> Result<(Repo, FetchReport)> {
    clone_with_depth(url, dir, s3, transfers, progress, None)
}

/// [`clone_from`]; with `depth`, a partial clone: only the cloned branch (`main`, or
/// the first), and only its newest `depth` versions with what they need (partial.rs).
pub fn clone_with_depth(
    url: &str,
    dir: &Path,
    s3: S3Options,
    transfers: usize,
    progress: Option<std::sync::Arc<dyn crate::repo::Progress>>,
    depth: Option<usize>,
) -> Result<(Repo, FetchReport)> {
    remote::check_no_secrets(url)?;
    if let Some(endpoint) = &s3.endpoint {
        remote::check_no_secrets(endpoint)?;
    }
    let cwd = std::env::current_dir().map_err(|e| Error::Io { action: "reading", path: ".".into(), source: e })?;
    let url = &absolute_dir_url(url, &cwd);
    // Open the remote first: a bad URL leaves no repository behind.
    let remote = remote::open(url, &s3)?;
    // As `git clone`: into a new or empty directory only, and a failed clone removes what
    // it created (the directories it made, or what it put in the empty one).
    let created = match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(Error::from(RepoError::InvalidPath {
                    path: dir.to_path_buf(),
                    reason: "exists and is not an empty directory (clone into a new or empty one)".into(),
                }));
            }
            None
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // The outermost directory this clone will create.
            let mut top = dir.to_path_buf();
            while let Some(parent) = top.parent().filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
                top = parent.to_path_buf();
            }
            Some(top)
        }
        Err(source) => return Err(Error::Io { action: "reading", path: dir.to_path_buf(), source }),
    };
    let result = clone_into(url, remote.as_ref(), dir, s3, transfers, progress, depth);
    if result.is_err() {
        match &created {
            Some(top) => {
                let _ = std::fs::remove_dir_all(top);
            }
            None => {
                if let Ok(entries) = std::fs::read_dir(dir) {
                    for entry in entries.flatten() {
                        let path = entry.path();
                        let _ = if entry.file_type().is_ok_and(|t| t.is_dir()) {
                            std::fs::remove_dir_all(&path)
                        } else {
                            std::fs::remove_file(&path)
                        };
                    }
                }
            }
        }
    }
    result
}

/// The body of [`clone_with_depth`], once `dir` is known to be new or empty.
fn clone_into(
    url: &str,
    remote: &dyn Remote,
    dir: &Path,
    s3: S3Options,
    transfers: usize,
    progress: Option<std::sync::Arc<dyn crate::repo::Progress>>,
    depth: Option<usize>,
) -> Result<(Repo, FetchReport)> {
    let only_branch = match depth {
        Some(0) => {
            return Err(Error::from(RepoError::UnknownRevision {
                rev: "--depth 0".into(),
                reason: "the depth must be at least 1".into(),
            }))
        }
        Some(_) => {
            let mut branches: Vec<String> = remote
                .list("refs/heads/")?
                .iter()
                .filter_map(|k| k.strip_prefix("refs/heads/"))
                .filter(|b| check_name(b).is_ok())
                .map(str::to_string)
                .collect();
            branches.sort();
            match branches.iter().position(|b| b == crate::repo::DEFAULT_BRANCH) {
                Some(i) => Some(branches.swap_remove(i)),
                None => branches.into_iter().next(),
            }
        }
        None => None,
    };
    let mut repo = Repo::init(dir)?;
    if let Some(p) = progress {
        repo.set_progress(p);
    }
    add_remote(&repo, "origin", url, s3)?;
    let report = match (&only_branch, depth) {
        (Some(b), Some(_)) => fetch_refs(&repo, remote, "origin", transfers, Some(b), depth)?,
        _ => fetch_from(&repo, remote, "origin", transfers)?,
    };
    let branches: Vec<String> = report
        .updated
        .iter()
        .filter(|u| u.kind == "branch")
        .filter_map(|u| u.name.strip_prefix("origin/").map(str::to_string))
        .collect();
    let branch = if branches.iter().any(|b| b == crate::repo::DEFAULT_BRANCH) {
        Some(crate::repo::DEFAULT_BRANCH.to_string())
    } else {
        branches.first().cloned()
    };
    if let Some(branch) = branch {
        let tip = repo.refs().get_remote("origin", &branch)?.expect("just fetched");
        repo.check_out(&tip, false)?;
        repo.refs().set(RefKind::Branch, &branch, &tip)?;
        repo.refs().set_head(&Head::Branch(branch))?;
    }
    Ok((repo, report))
}
