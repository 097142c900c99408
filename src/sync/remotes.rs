//! The remote list (`.ckpt/remotes`: NAME → URL and settings) and the remote's refs
//! (`refs/heads/NAME`, `refs/tags/NAME` holding a version id), moved by compare-and-swap.

use super::layout::Layout;
use super::transfer::OBJECT_ATTEMPTS;
use super::{Error, Result};
use crate::object_id::ObjectId;
use crate::remote::{self, Expect, Remote, S3Options};
use crate::repo::Error as RepoError;
use crate::repo::{check_name, RefKind, Repo, VersionId};
use std::collections::BTreeMap;
use std::path::Path;

/// The list of remotes, a JSON object NAME → [`RemoteConfig`].
const REMOTES_FILE: &str = "remotes";

/// One configured remote.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// `s3://bucket/prefix`, `file:///path` or a directory path.
    pub url: String,
    /// S3 settings stored with the remote (never credentials).
    #[serde(default, skip_serializing_if = "is_default")]
    pub s3: S3Options,
    /// How the remote stores versions ([`Layout::Mirror`] unless set; the default is not
    /// written).
    #[serde(default, skip_serializing_if = "Layout::is_default")]
    pub layout: Layout,
}

fn is_default(o: &S3Options) -> bool {
    *o == S3Options::default()
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

pub(super) fn ref_key(kind: RefKind, name: &str) -> String {
    match kind {
        RefKind::Branch => format!("refs/heads/{name}"),
        RefKind::Tag => format!("refs/tags/{name}"),
    }
}

pub(super) fn parse_ref(remote: &dyn Remote, key: &str, bytes: &[u8]) -> Result<VersionId> {
    let bad = || Error::BadRemoteRef {
        remote: remote.url().to_string(),
        key: key.to_string(),
        reason: "not a ref (expected 64 hex digits and a newline)".into(),
    };
    let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
    let hex = text.strip_suffix('\n').ok_or_else(bad)?;
    hex.parse::<ObjectId>().ok().filter(|id| id.to_hex() == hex).ok_or_else(bad)
}

/// The version the ref `key` of `remote` names; `None` if there is no such key (deleted since
/// it was listed). A ref that cannot be read (on a directory remote: a directory, a link, a
/// pipe) or does not hold a version id is an error naming it.
pub(super) fn read_ref(remote: &dyn Remote, key: &str) -> Result<Option<VersionId>> {
    match remote.get_small(key)? {
        Some(small) => Ok(Some(parse_ref(remote, key, &small.bytes)?)),
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

/// Refuses a ref of `remote` that is a directory: keys inside a ref's name (`refs/heads/main/x`)
/// and no key of that name among `keys` (sorted; a directory remote lists an empty directory
/// as a key, which its read then refuses). With `only_branch`, that branch alone is looked at.
pub(super) fn refuse_ref_directories(remote: &dyn Remote, keys: &[String], only_branch: Option<&str>) -> Result<()> {
    for key in keys {
        let Some((kind, name, true)) = ref_of_key(key) else { continue };
        if only_branch.is_some_and(|b| kind != RefKind::Branch || b != name) {
            continue;
        }
        let ref_key = ref_key(kind, name);
        if keys.binary_search(&ref_key).is_err() {
            return Err(Error::BadRemoteRef {
                remote: remote.url().to_string(),
                key: ref_key,
                reason: format!("not a ref: a directory (of {key})"),
            });
        }
    }
    Ok(())
}

/// The branches and tags of `remote` (with `only_branch`, that branch alone), sorted by key,
/// each read with [`read_ref`]: what a fetch or a clone takes. A key under `refs/` that is not
/// a branch or tag ([`ref_of_key`]) is not ckpt's and is left out; a ref that is a directory
/// ([`refuse_ref_directories`]) or cannot be read is an error naming it, never a ref that is
/// not there: a clone would be empty, a fetch would keep a stale remote-tracking ref.
pub(super) fn remote_refs(remote: &dyn Remote, only_branch: Option<&str>) -> Result<Vec<RemoteRef>> {
    let mut keys = remote.list("refs/")?;
    keys.sort();
    refuse_ref_directories(remote, &keys, only_branch)?;
    let mut refs = Vec::new();
    for key in &keys {
        let Some((kind, name, false)) = ref_of_key(key) else { continue };
        if only_branch.is_some_and(|b| kind != RefKind::Branch || b != name) {
            continue;
        }
        if let Some(id) = read_ref(remote, key)? {
            refs.push(RemoteRef { kind, name: name.to_string(), id });
        }
    }
    Ok(refs)
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

pub(super) fn write_remotes(repo: &Repo, remotes: &BTreeMap<String, RemoteConfig>) -> Result<()> {
    let mut text = serde_json::to_string_pretty(remotes).expect("remotes serialize");
    text.push('\n');
    Ok(repo.refs().write(&repo.ckpt_dir().join(REMOTES_FILE), &text)?)
}

/// Adds remote `name` at `url` with `layout` (checked by opening it: a directory remote is
/// created). A relative directory path is stored made absolute against the current directory;
/// a URL with credentials in it (user information, a query string) is refused
/// ([`remote::check_no_secrets`]).
pub fn add_remote(repo: &Repo, name: &str, url: &str, s3: S3Options, layout: Layout) -> Result<()> {
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
    let config = RemoteConfig { url: url.to_string(), s3, layout };
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

/// The layout of the remote `name`.
pub fn remote_layout(repo: &Repo, name: &str) -> Result<Layout> {
    let remotes = remotes(repo)?;
    Ok(remotes.get(name).ok_or_else(|| Error::NoSuchRemote { name: name.into() })?.layout)
}

/// The remote a command uses when none is named: `origin`, or the only one.
pub fn default_remote(repo: &Repo) -> Result<String> {
    let remotes = remotes(repo)?;
    if remotes.contains_key("origin") || remotes.len() != 1 {
        return Ok("origin".into());
    }
    Ok(remotes.into_keys().next().expect("one remote"))
}
